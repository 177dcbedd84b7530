//! Keys from headers: any header, or a bearer token (hashed).

use http::header::{HeaderName, AUTHORIZATION};

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// The value of a header, e.g. an API key or a tenant id.
///
/// The first value counts; an absent or empty header is a missing key. Use
/// [`HeaderKey::hashed`] for values that are secrets.
///
/// ```
/// use http::HeaderName;
/// use tower_throttle::key::{HeaderKey, KeyExtractor, KeyWriter, RequestHead};
///
/// let tenant = HeaderKey::new(HeaderName::from_static("x-tenant"));
/// let req = http::Request::builder().header("x-tenant", "acme").body(())?;
/// let mut key = Vec::new();
/// tenant.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key, b"acme");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    name: HeaderName,
    hashed: bool,
}

impl HeaderKey {
    /// The value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey {
            name,
            hashed: false,
        }
    }

    /// Stores a digest of the value instead of the value (for API keys).
    pub fn hashed(mut self) -> Self {
        self.hashed = true;
        self
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let value = req
            .headers()
            .get(&self.name)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty())
            .ok_or(MissingKey::new("the identifying header is missing"))?;
        if self.hashed {
            key.push_digest(value);
        } else {
            key.push(value);
        }
        Ok(())
    }
}

/// The bearer token of `Authorization: Bearer <token>`, as a SHA-256
/// digest: the token itself is never stored or logged, and every app
/// instance computes the same key.
///
/// ```
/// use tower_throttle::key::{BearerToken, KeyExtractor, KeyWriter, RequestHead};
///
/// let req = http::Request::builder().header("authorization", "Bearer s3cr3t").body(())?;
/// let mut key = Vec::new();
/// BearerToken.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key.len(), 32);
/// assert!(!String::from_utf8(key)?.contains("s3cr3t"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct BearerToken;

impl KeyExtractor for BearerToken {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let token = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))
            .ok_or(MissingKey::new("no bearer token"))?;
        key.push_digest(token);
        Ok(())
    }
}

fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || !rest.first()?.is_ascii_whitespace() {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Bearer "), None);
        assert_eq!(bearer(b"Bearerabc"), None);
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bear"), None);
    }

    #[test]
    fn header_key_escapes_or_hashes() {
        let req = http::Request::builder()
            .header("x-k", "a|b")
            .header("x-empty", "")
            .body(())
            .unwrap();
        let head = RequestHead::new(&req);
        let mut buf = Vec::new();
        HeaderKey::new(HeaderName::from_static("x-k"))
            .extract(&head, &mut KeyWriter::new(&mut buf))
            .unwrap();
        assert_eq!(buf, b"a%7cb");
        buf.clear();
        HeaderKey::new(HeaderName::from_static("x-k"))
            .hashed()
            .extract(&head, &mut KeyWriter::new(&mut buf))
            .unwrap();
        assert_eq!(buf.len(), 32);
        for name in ["x-empty", "x-absent"] {
            let r = HeaderKey::new(HeaderName::from_static(name))
                .extract(&head, &mut KeyWriter::new(&mut buf));
            assert!(r.is_err());
        }
    }
}
