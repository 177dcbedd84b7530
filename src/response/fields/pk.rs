//! The `pk` (partition key) parameter: a keyed hash of a rule's key, so
//! that a client can tell its partitions apart without learning the key.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Bytes of a partition key: 128 bits, 24 characters of base64.
pub(crate) const PK_LEN: usize = 16;

/// A partition key as written: the first 16 bytes of the HMAC.
pub(crate) type Pk = [u8; PK_LEN];

/// Writes a `pk` parameter on every `RateLimit` item
/// ([`ThrottleLayer::partition_keys`](crate::ThrottleLayer::partition_keys)):
/// HMAC-SHA-256 of the rule's key (the key extractor's output, without the
/// layer's prefix or the rule's name), truncated to 128 bits, as a
/// structured-field byte sequence (`pk=:3q2+7w3erb7erb7erb7erQ==:`).
///
/// The HMAC key is secret, so a `pk` cannot be reversed by hashing guessed
/// user ids or addresses, and the raw key is never written. The same client
/// gets the same `pk` for every rule keyed alike, and on every replica that
/// shares the secret ([`PartitionKeys::with_secret`]); with
/// [`PartitionKeys::random`] each process draws its own.
#[derive(Clone)]
pub struct PartitionKeys(Arc<Hmac>);

/// HMAC-SHA-256 with its key absorbed once (RFC 2104): the inner and outer
/// states are cloned per hash, two compressions fewer.
struct Hmac {
    inner: Sha256,
    outer: Sha256,
}

impl PartitionKeys {
    /// A key drawn from the operating system's randomness (through the
    /// standard library's `RandomState`), new for each call: partition keys
    /// are stable for the life of the process only.
    pub fn random() -> Self {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        let mut secret = [0u8; 32];
        for (i, chunk) in secret.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&state.hash_one(i).to_le_bytes());
        }
        Self::with_secret(&secret)
    }

    /// A key of your own, shared by every replica behind one name, so that
    /// a client sees one `pk` whichever replica answers.
    ///
    /// # Panics
    ///
    /// When `secret` is shorter than 16 bytes: too short to keep guessed
    /// keys from being checked against a `pk`.
    pub fn with_secret(secret: &[u8]) -> Self {
        assert!(
            secret.len() >= 16,
            "a partition-key secret needs at least 16 bytes, got {}",
            secret.len()
        );
        let mut block = [0u8; 64];
        if secret.len() > block.len() {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        Self::from_block(block)
    }

    /// The HMAC of a key already padded to SHA-256's block.
    fn from_block(block: [u8; 64]) -> Self {
        let pad = |byte: u8| {
            let mut h = Sha256::new();
            h.update(block.map(|b| b ^ byte));
            h
        };
        PartitionKeys(Arc::new(Hmac {
            inner: pad(0x36),
            outer: pad(0x5c),
        }))
    }

    /// The partition key of `key`, a rule's key as its extractor wrote it:
    /// what a service documents so that clients can predict their `pk`.
    pub fn of(&self, key: &[u8]) -> [u8; 16] {
        let mut inner = self.0.inner.clone();
        inner.update(key);
        let mut outer = self.0.outer.clone();
        outer.update(inner.finalize());
        let mut pk = [0u8; PK_LEN];
        pk.copy_from_slice(&outer.finalize()[..PK_LEN]);
        pk
    }
}

/// Never shows the key.
impl fmt::Debug for PartitionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionKeys(..)")
    }
}

/// `:<base64>:`, a structured-field byte sequence (RFC 9651, section 3.3.5).
pub(crate) fn push_byte_sequence(out: &mut Vec<u8>, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.push(b':');
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]);
            } else {
                out.push(b'=');
            }
        }
    }
    out.push(b':');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_and_base64_pads() {
        // RFC 4231, test case 2 ("Jefe" is too short a secret for the
        // public constructor, so the state is built here as it would be).
        let mut block = [0u8; 64];
        block[..4].copy_from_slice(b"Jefe");
        let keys = PartitionKeys::from_block(block);
        let pk = keys.of(b"what do ya want for nothing?");
        assert_eq!(pk[..4], [0x5b, 0xdc, 0xc1, 0x46]);
        assert_eq!(pk[8..], [0x6a, 0x04, 0x24, 0x26, 0x08, 0x95, 0x75, 0xc7]);

        for (bytes, text) in [
            (&b""[..], "::"),
            (b"f", ":Zg==:"),
            (b"fo", ":Zm8=:"),
            (b"foo", ":Zm9v:"),
            (b"foob", ":Zm9vYg==:"),
        ] {
            let mut out = Vec::new();
            push_byte_sequence(&mut out, bytes);
            assert_eq!(out, text.as_bytes());
        }
    }

    #[test]
    fn keys_differ_per_secret_and_long_secrets_are_hashed() {
        let a = PartitionKeys::with_secret(&[1; 16]);
        let b = PartitionKeys::with_secret(&[2; 16]);
        assert_eq!(a.of(b"alice"), a.clone().of(b"alice"));
        assert_ne!(a.of(b"alice"), b.of(b"alice"));
        assert_ne!(a.of(b"alice"), a.of(b"bob"));
        assert_ne!(
            PartitionKeys::random().of(b"x"),
            PartitionKeys::random().of(b"x")
        );
        let long = PartitionKeys::with_secret(&[7; 100]);
        assert_eq!(long.of(b"x"), long.of(b"x"));
        assert_eq!(format!("{a:?}"), "PartitionKeys(..)");
    }

    #[test]
    #[should_panic(expected = "at least 16 bytes")]
    fn short_secrets_are_refused() {
        let _ = PartitionKeys::with_secret(b"short");
    }
}
