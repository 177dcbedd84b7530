//! The `RateLimitResponse` of upstream's `shouldRateLimitWorker`: one
//! status per descriptor, the overall code (quota and shadow modes), and
//! the optional `RateLimit-*` headers.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use super::{current_limit, Counted, Options};
use crate::config::Limit;

/// What became of one descriptor.
pub(super) enum Outcome {
    NoLimit,
    Unlimited,
    Counted(Arc<Limit>, Counted),
}

pub(super) fn build(outcomes: &[Outcome], options: &Options) -> RateLimitResponse {
    let mut statuses = Vec::with_capacity(outcomes.len());
    let (mut failed, mut failed_quota, mut quota) = (0, 0, 0);
    // The descriptor the headers describe: an over-limit one, else the one
    // with the least remaining.
    let mut minimum: Option<usize> = None;
    let mut min_remaining = u32::MAX;
    for (i, outcome) in outcomes.iter().enumerate() {
        let status = match outcome {
            Outcome::NoLimit => {
                // Upstream counts every descriptor but the unlimited ones
                // as a quota descriptor under global QUOTA_MODE, so one
                // without a limit is a quota descriptor that passed.
                quota += usize::from(options.quota_mode);
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                }
            }
            Outcome::Unlimited => DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: u32::MAX,
                ..Default::default()
            },
            Outcome::Counted(limit, c) => {
                let in_quota = options.quota_mode || limit.quota_mode;
                if c.remaining < min_remaining {
                    minimum = Some(i);
                    min_remaining = c.remaining;
                }
                // Shadow mode answers OK but reports the rest as if over.
                let code = if c.over && !limit.shadow_mode {
                    Code::OverLimit
                } else {
                    Code::Ok
                };
                if code == Code::OverLimit {
                    if in_quota {
                        failed_quota += 1;
                    } else {
                        failed += 1;
                        minimum = Some(i);
                        min_remaining = 0;
                    }
                }
                quota += usize::from(in_quota);
                DescriptorStatus {
                    code: code as i32,
                    current_limit: Some(current_limit(limit)),
                    limit_remaining: if c.over { 0 } else { c.remaining },
                    duration_until_reset: Some(PbDuration {
                        seconds: i64::try_from(c.reset_secs).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                    ..Default::default()
                }
            }
        };
        statuses.push(status);
    }
    let over = failed > 0 || (quota > 0 && quota == failed_quota);
    let mut response = RateLimitResponse {
        overall_code: if over && !options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        ..Default::default()
    };
    if let (Some(names), Some(i)) = (&options.response_headers, minimum) {
        let s = &response.statuses[i];
        let limit = s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit);
        let reset = s.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
        response.response_headers_to_add = [
            limit.to_string(),
            s.limit_remaining.to_string(),
            reset.to_string(),
        ]
        .into_iter()
        .zip(names)
        .map(|(value, key)| HeaderValue {
            key: key.clone(),
            value,
            ..Default::default()
        })
        .collect();
    }
    response
}
