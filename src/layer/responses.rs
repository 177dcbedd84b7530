//! Builder methods of [`ThrottleLayer`]: the headers, request extension
//! and rejection bodies it writes.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::ThrottleLayer;
use crate::response::{BodyFormat, FieldProfile, PartitionKeys, Rejection, ResetFormat};
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
        self.settings.fields.ietf_headers = enabled;
        self
    }

    /// Which revision of draft-ietf-httpapi-ratelimit-headers the
    /// `RateLimit-Policy` and `RateLimit` fields follow (default: the latest
    /// published, [`FieldProfile::Draft11`]). Pin one to keep a client's
    /// parser on the revision it was written for when the crate moves on.
    #[must_use = "builders do nothing until used"]
    pub fn field_profile(mut self, profile: FieldProfile) -> Self {
        self.settings.fields.profile = profile;
        self
    }

    /// Writes a `pk` (partition key) parameter on every `RateLimit` item:
    /// a keyed hash of the rule's key, never the key itself (default off).
    /// Clients making requests for several users or resources can tell
    /// which quota a response describes. See [`PartitionKeys`] for the
    /// hash; share one secret across replicas with
    /// [`PartitionKeys::with_secret`].
    ///
    /// `RateLimit-Policy` carries no `pk`: it is rendered once per layer
    /// and the draft asks that it stay the same over a sequence of
    /// responses.
    #[must_use = "builders do nothing until used"]
    pub fn partition_keys(mut self, keys: PartitionKeys) -> Self {
        self.settings.fields.partition = Some(keys);
        self
    }

    /// Sends `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default off).
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.settings.fields.legacy_headers = enabled;
        self
    }

    /// How `X-RateLimit-Reset` is written: seconds from now (the default)
    /// or a Unix timestamp. Either way it is the time until the key is fully
    /// fresh, where the IETF `t` is the time until more quota is available.
    pub fn legacy_reset_format(mut self, format: ResetFormat) -> Self {
        self.settings.fields.legacy_reset = format;
        self
    }

    /// Rejection bodies as `text/plain` (the default).
    pub fn plain_text_body(mut self) -> Self {
        self.settings.body = BodyFormat::PlainText;
        self
    }

    /// Rejection bodies as RFC 9457 `application/problem+json`. A 429 is
    /// the draft's `quota-exceeded` problem
    /// ([`QUOTA_EXCEEDED`](crate::response::QUOTA_EXCEEDED)) with
    /// `violated-policies`, the names of the rules that denied:
    /// `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
    /// "title":"Quota Exceeded","status":429,"detail":"Too many requests: try
    /// again in 42 s.","violated-policies":["minute"]}`. Other rejections
    /// (503, a missing key) are `about:blank`. gRPC rejections stay gRPC
    /// statuses.
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
