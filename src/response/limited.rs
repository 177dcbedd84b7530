//! The layer's default plain-text 429, from fields built once: a template
//! with placeholders where a response's own values go, and, for the
//! common denial (one rule, nothing remaining, `t` equal to
//! `Retry-After`), the complete fields by seconds, so such a 429 is one
//! clone of a map and no rendering at all.

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{HeaderMap, Response, StatusCode};

use super::policy_field::request_policy_value;
use super::{
    ratelimit_value, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET,
};
use crate::decision::Decision;
use crate::info::{Meta, RateLimitInfo};
use crate::response::fields::{int_value, retry_body};

/// The plain-text 429 of `rule`'s denial `d`, when it is the common one:
/// nothing remaining, `t` equal to `Retry-After`, under the rule's own
/// policy, in a layer without legacy fields or partition keys. `None` for
/// any other denial, which [`limited_plain_text`] renders.
pub(crate) fn common_limited(
    meta: &Meta,
    rule: usize,
    d: &Decision,
) -> Option<Box<Response<Bytes>>> {
    if d.allowed || d.remaining != 0 || meta.legacy_headers || meta.partition.is_some() {
        return None;
    }
    let secs = d.retry_after_secs()?;
    if secs != d.quota_after_secs() {
        return None;
    }
    let summary = &meta.rules[rule];
    let params = meta.profile.params();
    let headers = meta.limited.common(rule, secs, || {
        summary.exhausted.get(params, &summary.name, secs)
    })?;
    Some(plain_429(secs, headers.clone()))
}

fn plain_429(secs: u64, headers: HeaderMap) -> Box<Response<Bytes>> {
    let mut response = Box::new(Response::new(retry_body(secs)));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    *response.headers_mut() = headers;
    response
}

/// The default 429 of `info`: the common one, or the layer's template
/// cloned with the response's values set in place, instead of hashing and
/// inserting every field. `None` (build it field by field) for a request
/// that can never be admitted.
pub(super) fn limited_plain_text(info: &RateLimitInfo) -> Option<Box<Response<Bytes>>> {
    if let [entry] = info.entries() {
        if !info.per_request_policy() {
            if let Some(response) = common_limited(info.meta(), entry.rule, &entry.decision) {
                return Some(response);
            }
        }
    }
    from_template(info)
}

/// [`limited_plain_text`] from the template.
pub(super) fn from_template(info: &RateLimitInfo) -> Option<Box<Response<Bytes>>> {
    let retry_secs = info.retry_after_secs()?;
    let mut headers = info.meta().limited.template.clone();
    let mut ratelimit_ok = true;
    for (name, value) in headers.iter_mut() {
        if name == RETRY_AFTER {
            *value = int_value(retry_secs);
        } else if name == RATELIMIT {
            match ratelimit_value(info) {
                Some(v) => *value = v,
                None => ratelimit_ok = false,
            }
        } else if name == X_RATELIMIT_LIMIT
            || name == X_RATELIMIT_REMAINING
            || name == X_RATELIMIT_RESET
        {
            let d = info.binding().decision;
            *value = if name == X_RATELIMIT_LIMIT {
                int_value(d.limit)
            } else if name == X_RATELIMIT_REMAINING {
                int_value(d.remaining)
            } else {
                info.meta().legacy_reset.value(d.reset_after)
            };
        }
    }
    if !ratelimit_ok {
        headers.remove(RATELIMIT);
    }
    if info.meta().ietf_headers && info.per_request_policy() {
        if let Some(policy) = request_policy_value(info) {
            headers.insert(RATELIMIT_POLICY, policy);
        }
    }
    Some(plain_429(retry_secs, headers))
}
