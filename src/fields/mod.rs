//! The pieces of the rate-limit fields: the IETF parameter names, items and
//! policy lists, the legacy reset format, and the prebuilt header values of
//! the common 429 (`cache.rs`). Nothing here knows requests, layers or
//! `RateLimitInfo`: `info` and `response` both build on it.
//!
//! Implements draft-ietf-httpapi-ratelimit-headers-10 (September 2025, the
//! latest revision published when this was written): `RateLimit-Policy`
//! items carry `q` (quota), `w` (window, seconds) and `qu` (quota unit);
//! `RateLimit` items carry `r` (remaining quota units) and `t` ("the number
//! of seconds until additional quota associated with the quota policy is
//! made available", rendered from [`Decision::quota_after`], rounded up).
//! Should a later revision rename a parameter, the constants below are the
//! only change.
//!
//! [`Decision::quota_after`]: crate::Decision::quota_after

use std::fmt::Write as _;

use http::HeaderValue;

use crate::decision::ceil_secs;
use crate::policy::Policy;

mod cache;

pub(crate) use cache::{int_value, interned, retry_body, ExhaustedItems};

/// The draft these fields follow.
pub const DRAFT: &str = "draft-ietf-httpapi-ratelimit-headers-10";

/// `RateLimit` item: remaining quota units.
const REMAINING: &str = "r";
/// `RateLimit` item: seconds until more quota is made available.
const RESET: &str = "t";
/// `RateLimit-Policy` item: the quota.
const QUOTA: &str = "q";
/// `RateLimit-Policy` item: the window, in seconds.
const WINDOW: &str = "w";
/// `RateLimit-Policy` item: the quota unit.
const QUOTA_UNIT: &str = "qu";

/// Structured-field integers stop at 15 digits.
pub(crate) const SF_INT_MAX: u64 = 999_999_999_999_999;

/// `"reply";q=5;w=60, "upload";q=2;qu="concurrent-requests"` for `rules`
/// (name, policy).
pub(crate) fn render_policies<'a>(
    rules: impl ExactSizeIterator<Item = (&'a str, &'a Policy)>,
) -> String {
    let mut s = String::with_capacity(rules.len() * 32);
    for (i, (name, policy)) in rules.enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        // Names are validated as [A-Za-z0-9_.-]: nothing to escape.
        let _ = write!(s, "\"{}\";{QUOTA}={}", name, policy.limit().min(SF_INT_MAX));
        if policy.is_concurrency() {
            let _ = write!(s, ";{QUOTA_UNIT}=\"concurrent-requests\"");
        } else {
            let secs = ceil_secs(policy.window()).min(SF_INT_MAX);
            let _ = write!(s, ";{WINDOW}={secs}");
        }
    }
    s
}

/// `"name";r=<remaining>;t=<secs>`: one `RateLimit` item. Written byte by
/// byte: it runs for every 429, where `core::fmt` cost more than the check.
pub(crate) fn ratelimit_item(s: &mut Vec<u8>, name: &str, remaining: u64, secs: u64) {
    s.push(b'"');
    s.extend_from_slice(name.as_bytes());
    s.extend_from_slice(b"\";");
    s.extend_from_slice(REMAINING.as_bytes());
    s.push(b'=');
    push_u64(s, remaining.min(SF_INT_MAX));
    s.push(b';');
    s.extend_from_slice(RESET.as_bytes());
    s.push(b'=');
    push_u64(s, secs.min(SF_INT_MAX));
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
