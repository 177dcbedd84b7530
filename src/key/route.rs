//! Keys from the route: the path, a path prefix, or axum's matched path.

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// The request path, or its first segments.
///
/// The full path has unbounded cardinality (`/users/1`, `/users/2`…); prefer
/// [`UriPath::first_segments`], or axum's route template with
/// `MatchedPathKey`, to count a route as a whole.
///
/// ```
/// use tower_throttle::key::{KeyExtractor, KeyWriter, RequestHead, UriPath};
///
/// let req = http::Request::builder().uri("/api/reply/123?x=1").body(())?;
/// let mut key = Vec::new();
/// UriPath::first_segments(2).extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key, b"/api/reply");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct UriPath {
    segments: Option<usize>,
}

impl UriPath {
    /// The whole path, without the query.
    pub const fn full() -> Self {
        UriPath { segments: None }
    }

    /// The first `n` segments of the path (`/a/b` for n = 2 of `/a/b/c`).
    pub const fn first_segments(n: usize) -> Self {
        UriPath { segments: Some(n) }
    }
}

impl KeyExtractor for UriPath {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let path = req.uri().path();
        let path = match self.segments {
            None => path,
            Some(0) => "",
            Some(n) => {
                // The `/` that ends segment n (the leading one starts segment 1).
                let end = path
                    .match_indices('/')
                    .map(|(i, _)| i)
                    .filter(|&i| i > 0)
                    .nth(n - 1)
                    .unwrap_or(path.len());
                &path[..end]
            }
        };
        key.push(path.as_bytes());
        Ok(())
    }

    fn per_client(&self) -> bool {
        false
    }
}

/// axum's route template (`/users/{id}`), set by the router: one bucket per
/// route whatever the parameters. Feature `axum`; works in `Router::layer`
/// and `route_layer`.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_throttle::{key::{MatchedPathKey, PeerIp}, MemoryStore, Policy, ThrottleLayer};
///
/// // 100 requests a minute per route template and client.
/// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(100, Duration::from_secs(60))?)
///     .key((MatchedPathKey, PeerIp::new()));
/// let app: Router = Router::new().route("/users/{id}", get(|| async { "user" })).layer(layer);
/// # let _ = app;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[cfg(feature = "axum")]
#[derive(Clone, Copy, Debug, Default)]
pub struct MatchedPathKey;

#[cfg(feature = "axum")]
impl KeyExtractor for MatchedPathKey {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let matched = req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .ok_or(MissingKey::new("no matched route"))?;
        key.push(matched.as_str().as_bytes());
        Ok(())
    }

    fn per_client(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(x: UriPath, uri: &str) -> String {
        let req = http::Request::builder().uri(uri).body(()).unwrap();
        let mut buf = Vec::new();
        x.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut buf))
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn path_prefixes() {
        assert_eq!(key(UriPath::full(), "/a/b/c?q=1"), "/a/b/c");
        assert_eq!(key(UriPath::first_segments(1), "/a/b/c"), "/a");
        assert_eq!(key(UriPath::first_segments(2), "/a/b/c"), "/a/b");
        assert_eq!(key(UriPath::first_segments(5), "/a/b/c"), "/a/b/c");
        assert_eq!(key(UriPath::first_segments(0), "/a/b"), "");
        assert_eq!(key(UriPath::first_segments(1), "/"), "/");
    }
}
