//! `RateLimit-Policy` values of a layer and of one request.

use http::HeaderValue;

use crate::info::{RateLimitInfo, RuleSummary};
use crate::response::fields::{interned, render_policies, Params};

/// `"reply";q=5;w=60, "upload";q=2;qu="concurrent-requests"`: a layer's
/// own policies, rendered once.
pub(crate) fn policy_value(params: &Params, rules: &[RuleSummary]) -> Option<HeaderValue> {
    let s = render_policies(params, rules.iter().map(|r| (&*r.name, &r.policy, r.unit)));
    interned(s.into_bytes())
}

/// The `RateLimit-Policy` of a request whose policies were chosen per
/// request: every rule of the layer, with the policy applied where it was
/// checked. Rendered per response, never interned (the policies may come
/// from a database: unbounded).
pub(crate) fn request_policy_value(info: &RateLimitInfo) -> Option<HeaderValue> {
    let meta = info.meta();
    let s = render_policies(
        meta.profile.params(),
        meta.rules.iter().enumerate().map(|(i, r)| {
            let applied = info.entries().iter().find(|e| e.rule == i);
            (&*r.name, applied.map_or(&r.policy, |e| &e.policy), r.unit)
        }),
    );
    HeaderValue::from_maybe_shared(bytes::Bytes::from(s)).ok()
}
