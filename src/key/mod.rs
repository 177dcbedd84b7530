//! Key extractors: which bucket a request is charged to.
//!
//! A [`KeyExtractor`] appends the identity of a request (its client IP, a
//! header, a user id set by an auth layer, the matched route…) to the rule's
//! key. The layer prepends `prefix:rule:` and bounds the length: a part longer
//! than [`MAX_KEY_PART`] bytes is replaced by `#` and a 128-bit SHA-256 digest,
//! stable across processes, so every app instance sharing a Redis store
//! computes the same key.
//!
//! | extractor | key part |
//! |---|---|
//! | [`Global`] | one bucket for everyone |
//! | [`PeerIp`] | the TCP peer's address (IPv6 grouped by a prefix, /56 by default) |
//! | [`ClientIp`] | the client behind trusted proxies (`X-Forwarded-For` / `Forwarded`) |
//! | [`HeaderKey`] | a header's value |
//! | [`BearerToken`] | the digest of `Authorization: Bearer …`, never the token |
//! | [`FromExtension`], [`FromExtensionWith`] | a typed value an auth layer put in the request extensions |
//! | [`UriPath`], `MatchedPathKey` (feature `axum`) | the path, a path prefix, or axum's route template |
//! | [`GrpcMethod`] | a gRPC call's `/package.Service/Method` (or service) |
//! | [`key_fn`] | any closure |
//! | `(A, B)` … `(A, B, C, D)` | several parts joined by `|` |
//! | [`KeyExtractor::or`] | a fallback when the first finds nothing |
//!
//! ```
//! use tower_throttle::key::{BearerToken, KeyExtractor, PeerIp, UriPath};
//!
//! // Per token and route; requests without a token are counted per client address.
//! let key = (BearerToken, UriPath::first_segments(2)).or(PeerIp::new());
//! # let _ = key;
//! ```

use std::fmt;

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};
use sha2::{Digest, Sha256};

mod combinator;
mod extension;
mod grpc;
mod header;
mod ip;
mod route;

pub use combinator::{key_fn, KeyFn, Or};
pub use extension::{FromExtension, FromExtensionWith};
pub use grpc::GrpcMethod;
pub use header::{BearerToken, HeaderKey};
pub use ip::{Cidr, CidrError, ClientAddr, ClientIp, ForwardedHeader, PeerIp, DEFAULT_IPV6_PREFIX};
#[cfg(feature = "axum")]
pub use route::MatchedPathKey;
pub use route::UriPath;

/// Key parts longer than this many bytes are replaced by their digest.
pub const MAX_KEY_PART: usize = 128;

/// A borrowed view of a request's head, whatever its body type.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// Borrows the head of `req`.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// Borrows a request head already split from its body.
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (set by the server, by `ConnectInfo`, by auth layers).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

/// No key could be extracted from a request; the layer's
/// [`OnMissingKey`](crate::mode::OnMissingKey) decides what happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingKey {
    reason: &'static str,
    misconfigured: bool,
}

impl MissingKey {
    /// A key the client failed to supply (no credential, no header), with a
    /// reason shown in the rejection body (keep it free of secrets).
    pub const fn new(reason: &'static str) -> Self {
        MissingKey {
            reason,
            misconfigured: false,
        }
    }

    /// A key the server cannot build because of its own configuration (no
    /// peer address: the server was not set up to record it). The client
    /// gets a `500` with a generic body, whatever the layer's
    /// [`OnMissingKey`](crate::mode::OnMissingKey); `reason`, the fix, is logged
    /// once at error level, never sent.
    pub const fn misconfigured(reason: &'static str) -> Self {
        MissingKey {
            reason,
            misconfigured: true,
        }
    }

    /// Whether the server's configuration, not the client, is at fault.
    pub fn is_misconfiguration(&self) -> bool {
        self.misconfigured
    }

    /// Why no key was found.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for MissingKey {}

/// Appends the key part of a request.
///
/// Implemented by the extractors of this module, by tuples of extractors, by
/// `Arc<dyn KeyExtractor>` and, through [`key_fn`], by closures.
pub trait KeyExtractor: Send + Sync + 'static {
    /// Writes this request's key part to `key`, or says why there is none.
    /// On error, anything already written is discarded by the caller.
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey>;

    /// Whether the keys of this extractor tell clients apart. `false` for
    /// keys every client of a route shares ([`Global`], [`UriPath`],
    /// [`MatchedPathKey`], [`GrpcMethod`]): a
    /// [lock-out](crate::ThrottleLayer::lockout) never counts strikes
    /// against such a key, since one client's denials would lock out every
    /// client (the rule's own limit still applies). The default is `true`;
    /// a [`key_fn`] closure is taken to tell clients apart.
    fn per_client(&self) -> bool {
        true
    }

    /// Uses `fallback` when this extractor finds no key. The fallback's part
    /// starts with `~`, so it never collides with a part of the first.
    ///
    /// ```
    /// use tower_throttle::key::{FromExtension, KeyExtractor, PeerIp};
    /// # #[derive(Clone)] struct UserId(u64);
    /// # impl std::fmt::Display for UserId {
    /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
    /// # }
    /// // Signed-in users by id, anonymous visitors by address.
    /// let key = FromExtension::<UserId>::new().or(PeerIp::new());
    /// # let _ = key;
    /// ```
    fn or<B: KeyExtractor>(self, fallback: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or::new(self, fallback)
    }
}

impl KeyExtractor for std::sync::Arc<dyn KeyExtractor> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        (**self).extract(req, key)
    }

    fn per_client(&self) -> bool {
        (**self).per_client()
    }
}

/// One bucket for every request (a global limit on a route).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{key::Global, MemoryStore, Policy, ThrottleLayer};
///
/// // At most 1000 searches a second, whoever sends them.
/// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::token_bucket(1000, 1000.0)?)
///     .key(Global)
///     .prefix("search");
/// # let _ = layer;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        key.push_raw(b"*");
        Ok(())
    }

    fn per_client(&self) -> bool {
        false
    }
}

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
