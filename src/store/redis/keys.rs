//! Redis key layout: `<prefix>:{<tag>}:<algorithm>:<key>`.
//!
//! * `<prefix>` is configured once and may not contain `{` or `}`, so the
//!   first `{` of every key is ours.
//! * `<tag>` is 8 lowercase hex digits (a stable 32-bit FNV-1a digest of the
//!   bytes chosen by [`HashTag`]): never a brace, so the hash slot is decided
//!   by the tag alone, whatever bytes the user key holds.
//! * `<algorithm>` keeps one key's state per algorithm apart.
//! * `<key>` is `=` followed by the user key's raw bytes when it is at most
//!   [`MAX_RAW_KEY`] bytes (braces, newlines and NULs are harmless after the
//!   tag: Redis keys are binary-safe and only the first `{…}` counts), else `#`
//!   followed by the 40-hex-digit SHA-1 of the key, so 10 KB ids cost 60 bytes.
//!   The two markers keep raw and hashed keys from ever colliding.

use super::registry::ScriptAlgorithm;
use crate::policy::Policy;

/// User keys longer than this are stored as their SHA-1.
pub const MAX_RAW_KEY: usize = 128;

/// Where the hash tag of a key comes from. All keys of one
/// [`Store::check_all`](crate::Store::check_all) must share a tag on a cluster
/// (a Lua script can only touch one slot).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HashTag {
    /// A digest of the whole key (default): keys spread evenly over a cluster;
    /// a multi-rule check on a cluster needs its keys to share a tag, so use
    /// another variant there.
    #[default]
    PerKey,
    /// A digest of the bytes after the first occurrence of the delimiter (the
    /// whole key if it has none). With keys built as `route:identity` (the
    /// layer's and the limiter's `prefix:`), every rule of one identity lands
    /// in one slot: `reply:alice` and `post:alice` share a tag. Only the part
    /// after the first delimiter, which the application's prefix ends, is
    /// used, so an identity full of delimiters or braces cannot move it.
    AfterFirst(u8),
    /// One tag for every key: everything in one slot (one master serves the
    /// whole limiter), so any rules can be combined.
    Fixed(String),
}

impl HashTag {
    /// The 8-hex-digit tag of `key`.
    pub(crate) fn tag(&self, key: &[u8]) -> [u8; 8] {
        let source: &[u8] = match self {
            HashTag::PerKey => key,
            HashTag::AfterFirst(d) => key
                .iter()
                .position(|b| b == d)
                .map_or(key, |i| &key[i + 1..]),
            HashTag::Fixed(s) => s.as_bytes(),
        };
        hex32(fnv1a32(source))
    }
}

/// The Redis Cluster slot of keys tagged `tag`: CRC16 (XMODEM) of the tag,
/// modulo 16384, as Redis computes it.
pub(crate) fn slot(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 0x3fff
}

/// 32-bit FNV-1a: stable across versions and platforms (it names keys).
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn hex32(n: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    for (i, o) in out.iter_mut().enumerate() {
        *o = HEX[((n >> (28 - 4 * i)) & 0xf) as usize];
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 0xf)] as char);
    }
    s
}

/// SHA-1 (hex) of `bytes`, computed by redis-rs's script hashing over the
/// hex of the bytes (injective, so distinct keys keep distinct digests).
fn digest(bytes: &[u8]) -> String {
    redis::Script::new(&hex(bytes)).get_hash().to_owned()
}

/// Appends the encoded user key: `=raw` or `#sha1`.
pub(crate) fn push_user_key(out: &mut Vec<u8>, key: &[u8]) {
    if key.len() <= MAX_RAW_KEY {
        out.push(b'=');
        out.extend_from_slice(key);
    } else {
        out.push(b'#');
        out.extend_from_slice(digest(key).as_bytes());
    }
}

/// The full Redis key of `key` under `policy`.
pub(crate) fn redis_key(prefix: &str, tag: [u8; 8], policy: &Policy, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 16 + key.len().min(MAX_RAW_KEY + 1));
    push_redis_key(&mut out, prefix, tag, policy, key);
    out
}

/// Appends [`redis_key`] to `out` (a reused buffer).
pub(crate) fn push_redis_key(
    out: &mut Vec<u8>,
    prefix: &str,
    tag: [u8; 8],
    policy: &Policy,
    key: &[u8],
) {
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(b":{");
    out.extend_from_slice(&tag);
    out.extend_from_slice(b"}:");
    out.extend_from_slice(ScriptAlgorithm::of(policy).key_code().as_bytes());
    out.push(b':');
    push_user_key(out, key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tags_and_keys_are_stable_and_brace_free() {
        let p = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
        let k = redis_key("t", HashTag::PerKey.tag(b"a{b}\n\0"), &p, b"a{b}\n\0");
        assert_eq!(&k[..3], b"t:{");
        assert_eq!(k.iter().filter(|&&b| b == b'{').count(), 2);
        assert_eq!(&k[11..17], b"}:f:=a");
        // FNV-1a of "" is the offset basis.
        assert_eq!(&HashTag::PerKey.tag(b""), b"811c9dc5");
        let long = vec![b'}'; 10_000];
        let k = redis_key("t", HashTag::PerKey.tag(&long), &p, &long);
        assert_eq!(k.len(), 2 + 10 + 3 + 1 + 40);
        let tag = HashTag::AfterFirst(b':');
        assert_eq!(tag.tag(b"reply:al:ice"), tag.tag(b"post:al:ice"));
        assert_ne!(tag.tag(b"reply:alice"), tag.tag(b"reply:bob"));
        // CRC16("123456789") = 0x31c3 (Redis's cluster spec); KEYSLOT foo = 12182.
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        let fixed = HashTag::Fixed("x".into());
        assert_eq!(fixed.tag(b"a"), fixed.tag(b"b"));
    }
}
