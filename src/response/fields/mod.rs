//! The pieces of the rate-limit fields: the IETF parameter names per draft
//! revision ([`FieldProfile`]), items and policy lists, partition keys
//! (`pk.rs`), the legacy reset format, and the prebuilt header values of the
//! common 429 (`cache.rs`). Nothing here knows requests, layers or
//! `RateLimitInfo`: `info` and `response` both build on it.
//!
//! `RateLimit-Policy` items carry `q` (quota), `qu` (quota unit, omitted
//! for the default `requests`), `w` (window, seconds); `RateLimit` items
//! carry `r` (units available now), `t` ("the number of seconds until
//! additional quota associated with the quota policy is made available",
//! rendered from [`Decision::quota_after`], rounded up) and, when enabled,
//! `pk` (a keyed hash of the rule's key).
//!
//! [`Decision::quota_after`]: crate::Decision::quota_after

use std::fmt::Write as _;

use http::{HeaderName, HeaderValue};

use crate::decision::ceil_secs;
use crate::policy::Policy;

mod cache;
mod limited;
mod pk;
mod profile;

pub(crate) use cache::{int_value, interned, retry_body, ExhaustedItems, CACHED};
pub(crate) use limited::LimitedFields;
pub use pk::PartitionKeys;
pub(crate) use pk::{push_byte_sequence, Pk};
pub(crate) use profile::Params;
pub use profile::{FieldProfile, QuotaUnit};

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `X-RateLimit-Limit` (legacy).
pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining` (legacy).
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (legacy; see [`ResetFormat`]).
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The `Content-Type` of the layer's plain-text responses.
pub(crate) const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

/// The draft the default [`FieldProfile`] follows.
pub const DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-11";

/// Structured-field integers stop at 15 digits.
pub(crate) const SF_INT_MAX: u64 = 999_999_999_999_999;

/// `"reply";q=5;w=60, "upload";q=2;qu="concurrent-requests"` for `rules`
/// (name, policy, unit), in the draft's order: `q`, `qu`, `w`.
pub(crate) fn render_policies<'a>(
    params: &Params,
    rules: impl ExactSizeIterator<Item = (&'a str, &'a Policy, Option<QuotaUnit>)>,
) -> String {
    let mut s = String::with_capacity(rules.len() * 32);
    for (i, (name, policy, unit)) in rules.enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        // Names are validated as [A-Za-z0-9_.-]: nothing to escape.
        let quota = policy.limit().min(SF_INT_MAX);
        let _ = write!(s, "\"{name}\";{}={quota}", params.quota);
        let unit = QuotaUnit::of(unit, policy);
        if unit != QuotaUnit::Requests {
            let _ = write!(s, ";{}=\"{}\"", params.quota_unit, unit.as_str());
        }
        // A concurrency limit has no window.
        if !policy.is_concurrency() {
            let secs = ceil_secs(policy.window()).min(SF_INT_MAX);
            let _ = write!(s, ";{}={secs}", params.window);
        }
    }
    s
}

/// `"name";r=<remaining>;t=<secs>[;pk=:<base64>:]`: one `RateLimit` item.
/// Written byte by byte: it runs for every 429, where `core::fmt` cost
/// more than the check.
pub(crate) fn ratelimit_item(
    s: &mut Vec<u8>,
    params: &Params,
    name: &str,
    remaining: u64,
    secs: u64,
    pk: Option<&Pk>,
) {
    s.push(b'"');
    s.extend_from_slice(name.as_bytes());
    s.extend_from_slice(b"\";");
    s.extend_from_slice(params.remaining.as_bytes());
    s.push(b'=');
    push_u64(s, remaining.min(SF_INT_MAX));
    s.push(b';');
    s.extend_from_slice(params.reset.as_bytes());
    s.push(b'=');
    push_u64(s, secs.min(SF_INT_MAX));
    if let Some(pk) = pk {
        s.push(b';');
        s.extend_from_slice(params.partition_key.as_bytes());
        s.push(b'=');
        push_byte_sequence(s, pk);
    }
}

/// Appends `n` in decimal.
pub(crate) fn push_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// How the legacy `X-RateLimit-Reset` gives the moment the key is fully
/// fresh again ([`Decision::reset_after`](crate::Decision::reset_after)).
/// Unlike the IETF `t`, this is the *full* reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now, rounded up (the default).
    #[default]
    Seconds,
    /// A Unix timestamp in seconds, rounded up, as GitHub's API sends it.
    /// Depends on the server's wall clock.
    UnixTimestamp,
}

impl ResetFormat {
    /// The value for a key fully fresh after `reset_after`.
    pub(crate) fn value(self, reset_after: std::time::Duration) -> HeaderValue {
        let secs = match self {
            ResetFormat::Seconds => ceil_secs(reset_after),
            ResetFormat::UnixTimestamp => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| ceil_secs(since.saturating_add(reset_after))),
        };
        int_value(secs)
    }
}
