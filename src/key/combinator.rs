//! Closures, fallbacks and tuples of extractors.

use std::fmt::{self, Display, Write as _};

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// A key computed by a closure; `None` is a missing key.
///
/// ```
/// use tower_throttle::key::{key_fn, RequestHead};
///
/// // One bucket per tenant subdomain.
/// let tenant = key_fn(|req: &RequestHead<'_>| {
///     req.uri().host()?.split('.').next().map(str::to_owned)
/// });
/// # let _ = tenant;
/// ```
pub fn key_fn<F, D>(f: F) -> KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<D> + Send + Sync + 'static,
    D: Display,
{
    KeyFn { f }
}

/// See [`key_fn`].
#[derive(Clone, Copy)]
pub struct KeyFn<F> {
    f: F,
}

impl<F> fmt::Debug for KeyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyFn")
    }
}

impl<F, D> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Option<D> + Send + Sync + 'static,
    D: Display,
{
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let value = (self.f)(req).ok_or(MissingKey::new("the key function found no key"))?;
        let _ = write!(key, "{value}");
        Ok(())
    }
}

/// The first extractor's key, else the fallback's (prefixed `~`). See
/// [`KeyExtractor::or`].
#[derive(Clone, Copy, Debug)]
pub struct Or<A, B> {
    first: A,
    fallback: B,
}

impl<A, B> Or<A, B> {
    /// `first`, else `fallback`.
    pub fn new(first: A, fallback: B) -> Self {
        Or { first, fallback }
    }
}

impl<A: KeyExtractor, B: KeyExtractor> KeyExtractor for Or<A, B> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let start = key.buf().len();
        match self.first.extract(req, key) {
            Ok(()) => Ok(()),
            Err(_) => {
                key.buf().truncate(start);
                key.push_raw(b"~");
                self.fallback.extract(req, key)
            }
        }
    }

    /// Only when both branches are: the fallback's key may be shared.
    fn per_client(&self) -> bool {
        self.first.per_client() && self.fallback.per_client()
    }
}

macro_rules! tuple_extractor {
    ($first:ident $(, $rest:ident)*) => {
        impl<$first: KeyExtractor $(, $rest: KeyExtractor)*> KeyExtractor for ($first, $($rest,)*) {
            #[allow(non_snake_case)]
            fn extract(
                &self,
                req: &RequestHead<'_>,
                key: &mut KeyWriter<'_>,
            ) -> Result<(), MissingKey> {
                let ($first, $($rest,)*) = self;
                $first.extract(req, key)?;
                $(
                    key.push_raw(b"|");
                    $rest.extract(req, key)?;
                )*
                Ok(())
            }

            /// When any part is: the whole key then tells clients apart.
            #[allow(non_snake_case)]
            fn per_client(&self) -> bool {
                let ($first, $($rest,)*) = self;
                $first.per_client() $(|| $rest.per_client())*
            }
        }
    };
}

tuple_extractor!(A, B);
tuple_extractor!(A, B, C);
tuple_extractor!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Global, HeaderKey};
    use http::HeaderName;

    fn key(x: &impl KeyExtractor, req: &http::Request<()>) -> Result<String, MissingKey> {
        let mut buf = Vec::new();
        x.extract(&RequestHead::new(req), &mut KeyWriter::new(&mut buf))?;
        Ok(String::from_utf8(buf).unwrap())
    }

    #[test]
    fn tuples_fallbacks_and_closures() {
        let req = http::Request::builder()
            .uri("/x")
            .header("a", "1|2")
            .header("b", "3")
            .body(())
            .unwrap();
        let a = HeaderKey::new(HeaderName::from_static("a"));
        let b = HeaderKey::new(HeaderName::from_static("b"));
        let none = HeaderKey::new(HeaderName::from_static("none"));
        // Escaping keeps ("1|2", "3") apart from ("1", "2|3").
        assert_eq!(key(&(a.clone(), b.clone()), &req).unwrap(), "1%7c2|3");
        assert_eq!(
            key(&(a.clone(), b.clone(), Global), &req).unwrap(),
            "1%7c2|3|*"
        );
        assert!(key(&(a.clone(), none.clone()), &req).is_err());
        assert_eq!(key(&none.clone().or(b.clone()), &req).unwrap(), "~3");
        assert_eq!(key(&b.clone().or(none.clone()), &req).unwrap(), "3");
        // A fallback after a partly written tuple discards the partial part.
        assert_eq!(
            key(&(b.clone(), none.clone()).or(Global), &req).unwrap(),
            "~*"
        );
        let f = key_fn(|r: &RequestHead<'_>| Some(r.uri().path().len()));
        assert_eq!(key(&f, &req).unwrap(), "2");
        let never = key_fn(|_: &RequestHead<'_>| None::<u8>);
        assert!(key(&never, &req).is_err());
    }
}
