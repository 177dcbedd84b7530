//! Keys from headers: any header, or a bearer token (hashed).

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// The value of a header, e.g. an API key or a tenant id.
///
/// An absent or empty header is a missing key. So is a header sent on more
/// than one line: an auth layer or the app may read another line than the
/// limiter would, so a client could be authenticated as one identity and
/// charged as another; the layer answers its
/// [`OnMissingKey`](crate::mode::OnMissingKey) response instead. Use
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
    #[must_use]
    pub fn hashed(mut self) -> Self {
        self.hashed = true;
        self
    }
}

impl KeyExtractor for HeaderKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let value = single(req, &self.name)
            .map_err(|()| MissingKey::new("the identifying header is sent more than once"))?
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
/// No `Authorization` header, another scheme, or an empty token is a missing
/// key; so are two or more `Authorization` lines, whatever they hold, since
/// an auth layer may read another line than the limiter would and charge
/// one token for another's requests.
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
        let token = single(req, &AUTHORIZATION)
            .map_err(|()| MissingKey::new("the Authorization header is sent more than once"))?
            .and_then(|v| bearer(v.as_bytes()))
            .ok_or(MissingKey::new("no bearer token"))?;
        key.push_digest(token);
        Ok(())
    }
}

/// The only line of header `name`: `Ok(None)` when absent, `Err` when
/// there are several.
fn single<'a>(req: &RequestHead<'a>, name: &HeaderName) -> Result<Option<&'a HeaderValue>, ()> {
    let mut lines = req.headers().get_all(name).iter();
    let first = lines.next();
    match lines.next() {
        None => Ok(first),
        Some(_) => Err(()),
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

    #[test]
    fn duplicate_lines_are_refused() {
        let req = http::Request::builder()
            .header("x-user-id", "alice")
            .header("x-user-id", "alice")
            .header("authorization", "Bearer a")
            .header("authorization", "Bearer a")
            .header("x-one", "bob")
            .body(())
            .unwrap();
        let head = RequestHead::new(&req);
        let mut buf = Vec::new();
        let user = HeaderKey::new(HeaderName::from_static("x-user-id"));
        for x in [&user, &user.clone().hashed()] {
            let e = x.extract(&head, &mut KeyWriter::new(&mut buf)).unwrap_err();
            assert!(e.reason().contains("more than once"), "{e}");
        }
        let e = BearerToken
            .extract(&head, &mut KeyWriter::new(&mut buf))
            .unwrap_err();
        assert!(e.reason().contains("more than once"), "{e}");
        HeaderKey::new(HeaderName::from_static("x-one"))
            .extract(&head, &mut KeyWriter::new(&mut buf))
            .unwrap();
        assert_eq!(buf, b"bob");
    }
}
