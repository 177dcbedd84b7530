//! The responses the layer writes itself (429, 503, a missing key) and the
//! rate-limit headers.
//!
//! Headers follow the layer's [`FieldProfile`] (draft-ietf-httpapi-ratelimit-headers-11
//! by default, [`DRAFT`]; the parameter names live in one place, `fields/`):
//! one `RateLimit-Policy` item per rule (`"reply";q=5;w=60`; concurrency
//! limits as `"upload";q=2;qu="concurrent-requests"`, byte quotas with
//! `qu="content-bytes"`) and one `RateLimit` item per rule
//! (`"reply";r=0;t=12`, `t` the seconds until more quota is made available,
//! rounded up: [`Decision::quota_after`](crate::Decision::quota_after), not
//! the time until the key is fully fresh; `;pk=:…:` with
//! [`PartitionKeys`]). A 429 also carries `Retry-After` in whole seconds,
//! rounded up and never 0, never earlier than the denying rule's `t`. The
//! legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` describe the binding
//! rule; `-Reset` is the time until the key is fully fresh, in seconds from
//! now or as a Unix timestamp ([`ResetFormat`]).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::info::{Meta, RateLimitInfo, RuleSummary};
use crate::store::StoreError;

pub(crate) mod fields;
mod limited;
mod policy_field;
mod problem;

#[cfg(test)]
use crate::response::fields::SF_INT_MAX;
use crate::response::fields::{int_value, ratelimit_item, retry_body};
pub(crate) use fields::LimitedFields;
use fields::TEXT_PLAIN;
pub use fields::{
    FieldProfile, PartitionKeys, QuotaUnit, ResetFormat, DRAFT, RATELIMIT, RATELIMIT_POLICY,
    X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
pub(crate) use limited::common_limited;
use limited::limited_plain_text;
pub(crate) use policy_field::policy_value;
use policy_field::request_policy_value;
use problem::problem_json;
pub use problem::QUOTA_EXCEEDED;

/// Which rate-limit fields a layer's responses carry, and how (set by the
/// layer's builder).
#[derive(Clone)]
pub(crate) struct FieldSettings {
    /// `RateLimit-Policy` and `RateLimit`.
    pub(crate) ietf_headers: bool,
    /// `X-RateLimit-*`.
    pub(crate) legacy_headers: bool,
    pub(crate) legacy_reset: ResetFormat,
    /// The draft revision of the IETF fields.
    pub(crate) profile: FieldProfile,
    /// Writes `pk` parameters, when set.
    pub(crate) partition: Option<PartitionKeys>,
}

impl Default for FieldSettings {
    fn default() -> Self {
        FieldSettings {
            ietf_headers: true,
            legacy_headers: false,
            legacy_reset: ResetFormat::default(),
            profile: FieldProfile::default(),
            partition: None,
        }
    }
}

/// What every response of a layer shares, rendered once when the layer
/// builds its service.
pub(crate) fn layer_meta(rules: Box<[RuleSummary]>, settings: &FieldSettings) -> Meta {
    let policy_header = policy_value(settings.profile.params(), &rules);
    Meta {
        limited: LimitedFields::new(
            rules.len(),
            policy_header.as_ref(),
            settings.ietf_headers,
            settings.legacy_headers,
        ),
        policy_header,
        rules,
        ietf_headers: settings.ietf_headers,
        legacy_headers: settings.legacy_headers,
        legacy_reset: settings.legacy_reset,
        profile: settings.profile,
        partition: settings.partition.clone(),
    }
}

/// Why the layer answered instead of the inner service; the argument of a
/// [custom response](crate::ThrottleLayer::custom_response).
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection<'a> {
    /// A rule denied the request (429).
    Limited(&'a RateLimitInfo),
    /// The store failed or timed out and the layer fails closed (503).
    Unavailable(&'a StoreError),
    /// A rule's key cannot be built because of the server's configuration
    /// (no peer address): 500, with a body that says so without internals.
    Misconfigured {
        /// The rule's name.
        rule: &'a str,
        /// What is wrong, for the client
        /// ([`MissingKey::explanation`](crate::key::MissingKey::explanation)).
        explanation: &'static str,
    },
    /// A rule found no key and the layer rejects such requests.
    MissingKey {
        /// The rule's name.
        rule: &'a str,
        /// What was missing.
        reason: &'static str,
        /// The configured status.
        status: StatusCode,
    },
}

impl Rejection<'_> {
    /// The status of the default response.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::MissingKey { status, .. } => *status,
            Rejection::Misconfigured { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A one-line human explanation, without internal details.
impl fmt::Display for Rejection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::Limited(info) => match info.retry_after_secs() {
                Some(secs) => write!(f, "Too many requests: try again in {secs} s."),
                None => f.write_str(
                    "Too many requests: this request exceeds the limit and can never be admitted.",
                ),
            },
            Rejection::Unavailable(_) => {
                f.write_str("The rate limiter is unavailable: try again later.")
            }
            Rejection::MissingKey { reason, .. } => {
                write!(f, "Cannot rate-limit this request: {reason}.")
            }
            Rejection::Misconfigured { explanation, .. } => write!(
                f,
                "Internal server error: rate limiting is misconfigured ({explanation}); \
                 the server's log says how to fix it."
            ),
        }
    }
}

/// Builds a custom rejection response.
pub(crate) type Responder = Arc<dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync>;

/// The body of the layer's own responses.
#[derive(Clone, Default)]
pub(crate) enum BodyFormat {
    #[default]
    PlainText,
    ProblemJson,
    Custom(Responder),
}

/// The response for `rejection`, with the rate-limit headers of a 429.
/// Boxed where it is built: it then moves as a pointer until it is sent.
pub(crate) fn rejection_response(
    format: &BodyFormat,
    rejection: &Rejection<'_>,
) -> Box<Response<Bytes>> {
    if let (BodyFormat::PlainText, Rejection::Limited(info)) = (format, rejection) {
        if let Some(response) = limited_plain_text(info) {
            return response;
        }
    }
    let mut response = match format {
        BodyFormat::Custom(f) => f(rejection),
        BodyFormat::PlainText => {
            let mut r = Response::new(plain_text(rejection));
            // Room for every header of a 429 at once: no growth, one allocation.
            r.headers_mut().reserve(6);
            r.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
            r
        }
        BodyFormat::ProblemJson => {
            let mut r = Response::new(Bytes::from(problem_json(rejection)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/problem+json"),
            );
            r
        }
    };
    if !matches!(format, BodyFormat::Custom(_)) {
        *response.status_mut() = rejection.status();
    }
    if let Rejection::Unavailable(_) = rejection {
        if !matches!(format, BodyFormat::Custom(_)) || !response.headers().contains_key(RETRY_AFTER)
        {
            response
                .headers_mut()
                .insert(RETRY_AFTER, int_value(UNAVAILABLE_RETRY_SECS));
        }
    }
    if let Rejection::Limited(info) = rejection {
        // A custom response may carry its own rate-limit fields: keep them.
        // The built-in ones carry none, so no lookups are needed.
        let custom = matches!(format, BodyFormat::Custom(_));
        let absent = |headers: &HeaderMap, name| !custom || !headers.contains_key(name);
        let headers = response.headers_mut();
        if let Some(secs) = info.retry_after_secs() {
            if absent(headers, RETRY_AFTER) {
                headers.insert(RETRY_AFTER, int_value(secs));
            }
        }
        if info.meta().ietf_headers && absent(headers, RATELIMIT) {
            add_ietf(headers, info);
        }
        if info.meta().legacy_headers && absent(headers, X_RATELIMIT_LIMIT) {
            add_legacy(headers, info);
        }
    }
    Box::new(response)
}

/// The `Retry-After` of a store-failure 503: soon, as a passing failure
/// (a failover, a timeout) is the common case.
pub const UNAVAILABLE_RETRY_SECS: u64 = 1;

/// Adds the configured headers to a forwarded request's response.
pub(crate) fn add_headers(headers: &mut HeaderMap, info: &RateLimitInfo) {
    if info.meta().ietf_headers {
        add_ietf(headers, info);
    }
    if info.meta().legacy_headers && !headers.contains_key(X_RATELIMIT_LIMIT) {
        add_legacy(headers, info);
    }
}

/// Adds this layer's items to the fields, merged into one line each with
/// the items a nested layer put there: a list may span field lines, but
/// some clients read only the first.
fn add_ietf(headers: &mut HeaderMap, info: &RateLimitInfo) {
    let policy = if info.per_request_policy() {
        request_policy_value(info)
    } else {
        info.meta().policy_header.clone()
    };
    if let Some(policy) = policy {
        merge_list(headers, RATELIMIT_POLICY, policy);
    }
    if let Some(value) = ratelimit_value(info) {
        merge_list(headers, RATELIMIT, value);
    }
}

/// `name: value`, or the field's lines so far and `value` as one list.
fn merge_list(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) {
    match headers.entry(name) {
        http::header::Entry::Vacant(v) => {
            v.insert(value);
        }
        http::header::Entry::Occupied(mut o) => {
            let mut joined = Vec::with_capacity(128);
            for line in o.iter().chain([&value]) {
                if !joined.is_empty() {
                    joined.extend_from_slice(b", ");
                }
                joined.extend_from_slice(line.as_bytes());
            }
            // Bytes of valid values joined by ", ": valid too.
            if let Ok(merged) = HeaderValue::from_bytes(&joined) {
                o.insert(merged);
            }
        }
    }
}

fn add_legacy(headers: &mut HeaderMap, info: &RateLimitInfo) {
    let d = info.binding().decision;
    headers.insert(X_RATELIMIT_LIMIT, int_value(d.limit));
    headers.insert(X_RATELIMIT_REMAINING, int_value(d.remaining));
    headers.insert(
        X_RATELIMIT_RESET,
        info.meta().legacy_reset.value(d.reset_after),
    );
}

/// `"reply";r=0;t=42, "day";r=97;t=86400`. Written byte by byte: this runs
/// for every 429 (and every response with headers on), where `core::fmt`
/// cost more than the rate-limit check itself.
pub(crate) fn ratelimit_value(info: &RateLimitInfo) -> Option<HeaderValue> {
    let params = info.meta().profile.params();
    if let [entry] = info.entries() {
        if entry.decision.remaining == 0 && entry.pk.is_none() {
            let rule = &info.meta().rules[entry.rule];
            let secs = entry.decision.quota_after_secs();
            if let Some(value) = rule.exhausted.get(params, &rule.name, secs) {
                return Some(value);
            }
        }
    }
    let mut s = Vec::with_capacity(info.entries().len() * 32);
    for (i, e) in info.entries().iter().enumerate() {
        if i > 0 {
            s.extend_from_slice(b", ");
        }
        let d = &e.decision;
        let name = &info.meta().rules[e.rule].name;
        ratelimit_item(
            &mut s,
            params,
            name,
            d.remaining,
            d.quota_after_secs(),
            e.pk.as_ref(),
        );
    }
    HeaderValue::from_maybe_shared(Bytes::from(s)).ok()
}

/// The plain-text body; the common 429 without `core::fmt`.
fn plain_text(rejection: &Rejection<'_>) -> Bytes {
    match rejection {
        Rejection::Limited(info) => match info.retry_after_secs() {
            Some(secs) => retry_body(secs),
            None => Bytes::from_static(
                b"Too many requests: this request exceeds the limit and can never be admitted.\n",
            ),
        },
        other => Bytes::from(format!("{other}\n")),
    }
}

#[cfg(test)]
mod tests;
