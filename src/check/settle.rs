//! The last stage: what one store answer means for the request under the
//! layer's mode ([`settle`]), as a [`Verdict`] or a wait.

use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::{count, HeldCharge, HeldPermits, LayerState, Plan};
use crate::grpc::{respond, Reply};
use crate::info::RateLimitInfo;
use crate::mode::{FailMode, Mode, MAX_DELAY_ATTEMPTS};
use crate::response::Rejection;
use crate::store::{Store, StoreError};

/// What a check decided for the request.
// Lives for one step on the stack before the response future boxes what an
// admission carries; boxing `Forward` here would allocate on every
// admitted request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Verdict<St: Store> {
    Forward {
        info: Option<RateLimitInfo>,
        permits: Option<HeldPermits<St>>,
        /// Counted by outcome: the charge to keep or refund.
        charge: Option<Box<HeldCharge<St>>>,
    },
    Reject(Box<Response<Bytes>>),
}

/// What to do after one store answer.
#[allow(clippy::large_enum_variant)]
pub(super) enum Step<St: Store> {
    Done(Verdict<St>),
    /// Delay mode: wait this long (or, with `on_release`, until this layer
    /// releases a permit, if sooner), then check again.
    Wait {
        wait: Duration,
        on_release: bool,
    },
    /// A rejection under a lock-out: its denial is to be recorded first
    /// (see [`super::lockout`]), which may lock the key.
    Strike(RateLimitInfo),
}

/// Applies the mode to one store answer; `waited` and `attempts` count the
/// delays so far.
pub(super) fn settle<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    answer: Result<RateLimitInfo, StoreError>,
    waited: Duration,
    attempts: u32,
) -> Step<St> {
    let mut info = match answer {
        Ok(info) => info,
        Err(error) => return Step::Done(store_failed(shared, plan.reply, error)),
    };
    if !info.allowed() {
        // The store's retry for a concurrency denial is the lease ceiling.
        shared.holds.estimate_retries(&mut info);
    }
    log_decisions(shared, plan, &info);
    if info.allowed() {
        count(shared, "allowed", None);
        let permits = HeldPermits::collect(shared, plan, &info);
        let charge = HeldCharge::collect(shared, plan, &info);
        return Step::Done(Verdict::Forward {
            info: Some(info),
            permits,
            charge,
        });
    }
    match shared.settings.mode {
        Mode::DryRun => {
            count(shared, "dry_run_limited", Some(info.binding().rule));
            tracing::info!(target: "tower_throttle", retry_after = ?info.retry_after(), "dry run: request would be rate-limited");
            return Step::Done(Verdict::Forward {
                info: Some(info),
                permits: None,
                charge: None,
            });
        }
        Mode::Delay { max_wait } => {
            let left = max_wait.saturating_sub(waited);
            if let Some(wait) = info.retry_after().filter(|_| attempts < MAX_DELAY_ATTEMPTS) {
                // Only concurrency rules deny: a release may come before the
                // estimate, so wait for it within whatever budget is left.
                if only_concurrency_denies(&info) && !left.is_zero() {
                    count(shared, "delayed", Some(info.binding().rule));
                    return Step::Wait {
                        wait: wait.min(left),
                        on_release: true,
                    };
                }
                if wait <= left {
                    count(shared, "delayed", Some(info.binding().rule));
                    return Step::Wait {
                        wait,
                        on_release: false,
                    };
                }
            }
        }
        Mode::Reject => {}
    }
    if shared.settings.lockout.is_some() {
        return Step::Strike(info);
    }
    Step::Done(limited(shared, plan, &info))
}

/// The rejection of a denied request.
pub(super) fn limited<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    info: &RateLimitInfo,
) -> Verdict<St> {
    count(shared, "limited", Some(info.binding().rule));
    Verdict::Reject(respond(
        &shared.settings.body,
        plan.reply,
        &Rejection::Limited(info),
        false,
    ))
}

/// True when every denying rule of `info` is a concurrency limit.
fn only_concurrency_denies(info: &RateLimitInfo) -> bool {
    info.entries()
        .iter()
        .filter(|e| !e.decision.allowed)
        .all(|e| e.policy.is_concurrency())
}

pub(super) fn store_failed<St: Store>(
    shared: &LayerState<St>,
    reply: Reply,
    error: StoreError,
) -> Verdict<St> {
    count(shared, "store_error", None);
    let fail = shared.settings.fail;
    tracing::warn!(target: "tower_throttle", %error, fail_mode = ?fail, "rate-limit store failed");
    match fail {
        FailMode::Open => Verdict::Forward {
            info: None,
            permits: None,
            charge: None,
        },
        FailMode::Closed => Verdict::Reject(respond(
            &shared.settings.body,
            reply,
            &Rejection::Unavailable(&error),
            false,
        )),
    }
}

fn log_decisions<St>(shared: &LayerState<St>, plan: &Plan, info: &RateLimitInfo) {
    if !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG) {
        return;
    }
    for (a, (name, _, d)) in plan.actives().iter().zip(info.iter()) {
        tracing::debug!(
            target: "tower_throttle",
            rule = name,
            key = %plan.key(a).escape_ascii(),
            cost = a.cost,
            allowed = d.allowed,
            remaining = d.remaining,
            retry_after_ms = d.retry_after.map(|r| r.as_millis() as u64),
            mode = ?shared.settings.mode,
            "rate-limit decision"
        );
    }
}
