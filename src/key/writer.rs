//! [`KeyWriter`]: where an extractor writes its key part, escaped so parts
//! cannot run into each other; and the digests that bound a part's length.

use std::fmt;

use sha2::{Digest, Sha256};

/// Where an extractor writes its key part.
///
/// [`KeyWriter::push`] and the [`fmt::Write`] impl escape `|` and `%` (the
/// tuple separator and the escape itself) and control bytes, so parts written
/// by different extractors cannot run into each other.
#[derive(Debug)]
pub struct KeyWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> KeyWriter<'a> {
    /// A writer appending to `buf`.
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        KeyWriter { buf }
    }

    /// Appends `bytes`, escaped.
    pub fn push(&mut self, bytes: &[u8]) {
        // Most key parts (ids, names, addresses) need no escaping: one
        // word-at-a-time scan, then a single copy.
        if !any_escaped(bytes) {
            self.buf.extend_from_slice(bytes);
            return;
        }
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| ESCAPED[usize::from(b)]) {
            self.buf.extend_from_slice(&rest[..i]);
            let b = rest[i];
            self.buf
                .extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
            rest = &rest[i + 1..];
        }
        self.buf.extend_from_slice(rest);
    }

    /// Appends a 128-bit SHA-256 digest of `bytes` as 32 hex digits: for
    /// secrets and unbounded values.
    pub fn push_digest(&mut self, bytes: &[u8]) {
        push_digest(self.buf, bytes);
    }

    /// Appends bytes known to need no escaping (addresses, digests).
    pub(crate) fn push_raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The buffer, for extractors that compose others.
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        self.buf
    }
}

impl fmt::Write for KeyWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Whether some byte of `bytes` is [`ESCAPED`], eight bytes at a time
/// (a per-byte table scan cost more than the rest of the key).
#[inline]
fn any_escaped(bytes: &[u8]) -> bool {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let half = |i: usize| {
        let mut w = [0u8; 4];
        w.copy_from_slice(&bytes[i..i + 4]);
        u64::from(u32::from_le_bytes(w))
    };
    let n = bytes.len();
    if n >= 8 {
        let mut i = 0;
        while i + 8 <= n {
            if word_escaped(word(i)) {
                return true;
            }
            i += 8;
        }
        // The last, overlapping word: bytes tested twice change nothing.
        i < n && word_escaped(word(n - 8))
    } else if n >= 4 {
        word_escaped(half(0) | half(n - 4) << 32)
    } else {
        bytes.iter().any(|&b| ESCAPED[usize::from(b)])
    }
}

/// Whether a byte of `x` is a control (below 0x20, or 0x7f), `|`, `%` or `~`
/// (the [`ESCAPED`] set). Each test flags a byte's high bit exactly where
/// the first match is; bytes of 0x80 and above never match.
#[inline]
fn word_escaped(x: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |y: u64| y.wrapping_sub(ONES) & !y & HIGH;
    let below_space = x.wrapping_sub(ONES * 0x20) & !x & HIGH;
    let equal = |b: u8| zero_byte(x ^ (ONES * u64::from(b)));
    (below_space | equal(b'|') | equal(b'%') | equal(b'~') | equal(0x7f)) != 0
}

/// Bytes written as `%hh`: the key separators, `%` itself, and controls.
/// A table, so scanning a key part is one load per byte.
static ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = matches!(b as u8, b'|' | b'%' | b'~') || b < 0x20 || b == 0x7f;
        b += 1;
    }
    table
};

/// The first 16 bytes of SHA-256, in hex: stable across processes and
/// versions, so it can name keys in a shared store.
pub(crate) fn push_digest(out: &mut Vec<u8>, bytes: &[u8]) {
    let digest = Sha256::digest(bytes);
    for &b in &digest[..16] {
        out.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
}

/// Replaces `buf[start..]` by `#` and its digest when longer than `max`.
/// Inline: every request pays the length test, rarely the digest.
#[inline]
pub(crate) fn bound_key_part(buf: &mut Vec<u8>, start: usize, max: usize) {
    if buf.len() - start > max {
        digest_key_part(buf, start);
    }
}

#[cold]
#[inline(never)]
fn digest_key_part(buf: &mut Vec<u8>, start: usize) {
    let digest = Sha256::digest(&buf[start..]);
    buf.truncate(start);
    buf.push(b'#');
    for &b in &digest[..16] {
        buf.extend_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::MAX_KEY_PART;

    #[test]
    fn the_word_scan_agrees_with_the_table() {
        // Every byte value at every position of keys up to 24 bytes long.
        for len in 1..=24 {
            for at in 0..len {
                for b in 0..=255u8 {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = b;
                    assert_eq!(
                        any_escaped(&bytes),
                        ESCAPED[usize::from(b)],
                        "byte {b:#04x} at {at} of {len}"
                    );
                }
            }
        }
        assert!(!any_escaped(b""));
        assert!(!any_escaped("user-1234-é}{".as_bytes()));
    }

    #[test]
    fn escapes_separators_and_controls() {
        let mut buf = Vec::new();
        KeyWriter::new(&mut buf).push(b"a|b%c~\n");
        assert_eq!(buf, b"a%7cb%25c%7e%0a");
    }

    #[test]
    fn long_parts_become_fixed_length_digests() {
        let mut buf = b"p:".to_vec();
        buf.extend(std::iter::repeat_n(b'x', 500));
        bound_key_part(&mut buf, 2, MAX_KEY_PART);
        assert_eq!(buf.len(), 2 + 1 + 32);
        assert_eq!(buf[2], b'#');
        // Stable across processes: a known SHA-256 prefix.
        let mut d = Vec::new();
        push_digest(&mut d, b"abc");
        assert_eq!(d, b"ba7816bf8f01cfea414140de5dae2223");
        let mut short = b"p:abc".to_vec();
        bound_key_part(&mut short, 2, MAX_KEY_PART);
        assert_eq!(short, b"p:abc");
    }
}
