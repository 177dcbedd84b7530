//! The IETF rate-limit fields, rendered in this one place.
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

use super::{cache, push_u64};
use crate::decision::ceil_secs;
use crate::info::{RateLimitInfo, RuleSummary};
use crate::policy::Policy;

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

/// `"reply";q=5;w=60, "upload";q=2;qu="concurrent-requests"`: a layer's
/// own policies, rendered once.
pub(crate) fn policy_value(rules: &[RuleSummary]) -> Option<HeaderValue> {
    let s = render_policies(rules.iter().map(|r| (&*r.name, &r.policy)));
    cache::interned(s.into_bytes())
}

/// The `RateLimit-Policy` of a request whose policies were chosen per
/// request: every rule of the layer, with the policy applied where it was
/// checked. Rendered per response, never interned (the policies may come
/// from a database: unbounded).
pub(crate) fn request_policy_value(info: &RateLimitInfo) -> Option<HeaderValue> {
    let rules = &info.meta().rules;
    let s = render_policies(rules.iter().enumerate().map(|(i, r)| {
        let applied = info.entries().iter().find(|e| e.rule == i);
        (&*r.name, applied.map_or(&r.policy, |e| &e.policy))
    }));
    HeaderValue::from_maybe_shared(bytes::Bytes::from(s)).ok()
}

fn render_policies<'a>(rules: impl ExactSizeIterator<Item = (&'a str, &'a Policy)>) -> String {
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
