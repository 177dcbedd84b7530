//! The `x-user` header as the key, for tower_governor, so that the layer
//! benchmarks key both middlewares identically. Shared by `benches/layer.rs`
//! and `examples/bench_server.rs` through `#[path]`.

use http::{HeaderName, HeaderValue, Request};
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::GovernorError;

/// The header both middlewares key on.
pub const USER: HeaderName = HeaderName::from_static("x-user");

/// tower_governor's key: the value of [`USER`].
#[derive(Clone)]
pub struct UserHeader;

impl KeyExtractor for UserHeader {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get(&USER)
            .cloned()
            .ok_or(GovernorError::UnableToExtractKey)
    }
}
