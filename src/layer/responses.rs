//! Builder methods of [`ThrottleLayer`]: the headers, request extension
//! and rejection bodies it writes.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::ThrottleLayer;
use crate::response::{BodyFormat, Rejection, ResetFormat};
use crate::store::Store;

impl<St: Store> ThrottleLayer<St> {
    /// Adds `RateLimit-Policy` / `RateLimit` (and the legacy headers if
    /// enabled) to admitted responses too (default: only to 429s, and in
    /// dry-run mode).
    pub fn headers_on_allowed(mut self, enabled: bool) -> Self {
        self.settings.headers_on_allowed = enabled;
        self
    }

    /// Inserts a [`RateLimitInfo`](crate::RateLimitInfo) into the
    /// extensions of every request the layer forwards, for handlers
    /// (default off: it costs two allocations per checked request, about a
    /// third of the layer's time on the in-process path). Requests let
    /// through unchecked (`skip_if`, no key, a store failed open) get one
    /// too, saying why, at no allocation. Turn it on when a handler reads
    /// it: in axum, `Extension<RateLimitInfo>` behind a layer without it
    /// answers 500.
    pub fn request_info(mut self, enabled: bool) -> Self {
        self.settings.request_info = enabled;
        self
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ietf_headers(mut self, enabled: bool) -> Self {
        self.settings.ietf_headers = enabled;
        self
    }

    /// Sends `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default off).
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.settings.legacy_headers = enabled;
        self
    }

    /// How `X-RateLimit-Reset` is written: seconds from now (the default)
    /// or a Unix timestamp. Either way it is the time until the key is fully
    /// fresh, where the IETF `t` is the time until more quota is available.
    pub fn legacy_reset_format(mut self, format: ResetFormat) -> Self {
        self.settings.legacy_reset = format;
        self
    }

    /// Rejection bodies as `text/plain` (the default).
    pub fn plain_text_body(mut self) -> Self {
        self.settings.body = BodyFormat::PlainText;
        self
    }

    /// Rejection bodies as RFC 9457 `application/problem+json`.
    pub fn problem_json_body(mut self) -> Self {
        self.settings.body = BodyFormat::ProblemJson;
        self
    }

    /// Builds every rejection response with `f`. The `Retry-After` and
    /// rate-limit headers are added to a 429 unless `f` set them.
    pub fn custom_response(
        mut self,
        f: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.settings.body = BodyFormat::Custom(Arc::new(f));
        self
    }
}
