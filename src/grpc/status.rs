//! The two protobuf messages a limited call carries, encoded by hand: a
//! `google.rpc.Status` whose details hold a `google.rpc.RetryInfo`, and the
//! `-bin` header encoding (base64 without padding) and `grpc-message`
//! percent-encoding of the gRPC HTTP/2 protocol.
//!
//! Hand-written so the library needs no protobuf runtime; the tests decode
//! the bytes with prost and tonic-types.

use std::time::Duration;

/// The `type_url` of a packed `google.rpc.RetryInfo`.
pub(crate) const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// Protobuf wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// `google.rpc.Status { code, message, details }`, with one
/// `RetryInfo { retry_delay }` detail when `retry_delay` is set.
pub(crate) fn encode_status(code: i32, message: &str, retry_delay: Option<Duration>) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + message.len());
    if code != 0 {
        // int32: negative values are sign-extended to ten bytes, as protobuf does.
        varint_field(&mut out, 1, code as i64 as u64);
    }
    if !message.is_empty() {
        len_field(&mut out, 2, message.as_bytes());
    }
    if let Some(delay) = retry_delay {
        let any = encode_any(RETRY_INFO_TYPE_URL, &encode_retry_info(delay));
        len_field(&mut out, 3, &any);
    }
    out
}

/// `google.rpc.RetryInfo { retry_delay: google.protobuf.Duration }`.
fn encode_retry_info(delay: Duration) -> Vec<u8> {
    let mut duration = Vec::with_capacity(16);
    // `Duration.seconds` is an int64: clamp what cannot be represented.
    let seconds = delay.as_secs().min(i64::MAX as u64);
    if seconds != 0 {
        varint_field(&mut duration, 1, seconds);
    }
    if delay.subsec_nanos() != 0 {
        varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
    }
    let mut out = Vec::with_capacity(duration.len() + 2);
    len_field(&mut out, 1, &duration);
    out
}

/// `google.protobuf.Any { type_url, value }`.
fn encode_any(type_url: &str, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(type_url.len() + value.len() + 6);
    len_field(&mut out, 1, type_url.as_bytes());
    len_field(&mut out, 2, value);
    out
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    varint(out, u64::from(field << 3 | u32::from(VARINT)));
    varint(out, value);
}

fn len_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    varint(out, u64::from(field << 3 | u32::from(LEN)));
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Standard base64 (RFC 4648 §4) without padding: the gRPC HTTP/2 protocol
/// says implementations "should emit un-padded values" for `-bin` headers.
pub(crate) fn base64_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        // A chunk of k bytes gives k + 1 characters.
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// `grpc-message`: bytes outside space and visible ASCII, and `%`, become
/// `%XX` (the protocol's Percent-Encoded production).
pub(crate) fn percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_has_no_padding() {
        assert_eq!(base64_unpadded(b""), "");
        assert_eq!(base64_unpadded(b"f"), "Zg");
        assert_eq!(base64_unpadded(b"fo"), "Zm8");
        assert_eq!(base64_unpadded(b"foo"), "Zm9v");
        assert_eq!(base64_unpadded(b"foob"), "Zm9vYg");
        assert_eq!(base64_unpadded(&[0xfb, 0xff]), "+/8");
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("try again in 3 s."), "try again in 3 s.");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }

    #[test]
    fn status_bytes_match_protobuf() {
        // Field 1 varint 8, field 2 "x", field 3 an Any of RetryInfo{1.5 s}.
        let bytes = encode_status(8, "x", Some(Duration::from_millis(1500)));
        let mut expected = vec![0x08, 8, 0x12, 1, b'x', 0x1a];
        let retry = [0x0a, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let mut any = vec![0x0a, RETRY_INFO_TYPE_URL.len() as u8];
        any.extend_from_slice(RETRY_INFO_TYPE_URL.as_bytes());
        any.extend_from_slice(&[0x12, retry.len() as u8]);
        any.extend_from_slice(&retry);
        expected.push(any.len() as u8);
        expected.extend_from_slice(&any);
        assert_eq!(bytes, expected);
        assert_eq!(encode_status(14, "", None), vec![0x08, 14]);
    }
}
