//! The last stage, [`settle`]: what one answer of the store means for the
//! request under the layer's mode, as a [`Verdict`] or a wait.

use std::ops::ControlFlow;

use bytes::Bytes;
use http::Response;

use super::{
    count, decide, lockout, poll_now, HeldCharge, HeldPermits, LayerState, Plan, Reach, Ruling,
};
use crate::grpc::{respond, Reply};
use crate::info::{NotLimited, RateLimitInfo};
use crate::limiter::{Pause, WaitBudget};
use crate::mode::{FailMode, Mode};
use crate::response::Rejection;
use crate::store::{Store, StoreError};
use crate::upgrade::UpgradePermit;

/// What a check decided for the request: two words, so the stages and the
/// service pass it on without copying an admission's figures around.
pub(crate) enum Verdict<St: Store> {
    /// Forward, with what the admission carries to its response, if
    /// anything (boxed once here; the response future keeps the box).
    Forward(Option<Box<Carried<St>>>),
    Reject(Box<Response<Bytes>>),
}

impl<St: Store> Verdict<St> {
    /// Forward with nothing to carry: admitted, or not limited.
    pub(crate) fn forward() -> Self {
        Verdict::Forward(None)
    }

    /// Forward, carrying `info`, `permits` and `charge`.
    fn carrying(
        info: RateLimitInfo,
        permits: Option<HeldPermits<St>>,
        charge: Option<Box<HeldCharge<St>>>,
    ) -> Self {
        Verdict::Forward(Some(Box::new(Carried {
            info: Some(info),
            headers: None,
            permits,
            upgrade: None,
            charge,
        })))
    }

    /// Forward a request the layer did not check, carrying an info that
    /// says why when handlers read it (a shared reference, no allocation).
    #[cold]
    pub(crate) fn unchecked(shared: &LayerState<St>, why: NotLimited) -> Self {
        if !shared.settings.request_info {
            return Verdict::forward();
        }
        let info = RateLimitInfo::unchecked(shared.meta.clone(), why);
        Verdict::carrying(info, None, None)
    }
}

/// Applies the mode to one answer of the store, through the store's
/// futures: the request's [`Verdict`], or in delay mode a [`Pause`]. A
/// rejection under a lock-out first records its strikes (see
/// [`super::lockout`]), which may lock the key. `budget` is what is left
/// of the delay; `reply` gives the protocol a rejection is answered in.
pub(super) async fn settle<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    answer: Ruling,
    budget: &WaitBudget,
    reply: &impl Fn() -> Reply,
) -> ControlFlow<Verdict<St>, Pause> {
    match judge(shared, plan, answer, Some(budget), reply) {
        Ok(settled) => settled,
        Err(mut info) => {
            // Boxed: a rare path, kept out of the future of every check.
            Box::pin(lockout::strike(shared, plan, &mut info, Reach::Later)).await;
            ControlFlow::Break(limited(shared, reply(), &info))
        }
    }
}

/// [`settle`] in process, where nothing waits: the same judgement, and a
/// lock-out's strikes recorded at once (or in the background, should the
/// store need a future).
#[inline]
pub(super) fn settle_now<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    answer: Ruling,
    reply: &impl Fn() -> Reply,
) -> Verdict<St> {
    match judge(shared, plan, answer, None, reply) {
        Ok(ControlFlow::Break(verdict)) => verdict,
        Ok(ControlFlow::Continue(_)) => unreachable!("only delay mode waits, never in process"),
        Err(mut info) => {
            let striking = lockout::strike(shared, plan, &mut info, Reach::Now);
            poll_now(std::pin::pin!(striking));
            limited(shared, reply(), &info)
        }
    }
}

/// The mode applied to one answer; `Err` is a denial under a lock-out,
/// rejected once its strikes are recorded.
#[allow(clippy::result_large_err)] // on the stack for one call
#[inline]
fn judge<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    answer: Ruling,
    budget: Option<&WaitBudget>,
    reply: &impl Fn() -> Reply,
) -> Result<ControlFlow<Verdict<St>, Pause>, RateLimitInfo> {
    let mut info = match answer {
        Ruling::Admitted => {
            count(shared, "allowed", None);
            return Ok(ControlFlow::Break(Verdict::forward()));
        }
        Ruling::Decided(decided, _) => decide::info(shared, plan, decided),
        Ruling::Locked(info) => {
            let info = *info;
            count(shared, "locked", Some(info.binding().rule));
            return Ok(ControlFlow::Break(reject(shared, reply(), &info)));
        }
        Ruling::Failed(error) => {
            return Ok(ControlFlow::Break(store_failed(shared, reply(), error)))
        }
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
        return Ok(ControlFlow::Break(Verdict::carrying(info, permits, charge)));
    }
    match shared.settings.mode {
        Mode::DryRun => {
            count(shared, "dry_run_limited", Some(info.binding().rule));
            tracing::info!(target: "tower_throttle", retry_after = ?info.retry_after(), "dry run: request would be rate-limited");
            return Ok(ControlFlow::Break(Verdict::carrying(info, None, None)));
        }
        Mode::Delay { .. } => {
            // Only concurrency rules deny: a release may come before the
            // estimate, so wait for it within whatever budget is left.
            let on_release = only_concurrency_denies(&info);
            if let Some(pause) = budget.and_then(|b| b.pause(info.retry_after(), on_release)) {
                count(shared, "delayed", Some(info.binding().rule));
                return Ok(ControlFlow::Continue(pause));
            }
        }
        Mode::Reject => {}
    }
    if shared.settings.lockout.is_some() {
        return Err(info);
    }
    Ok(ControlFlow::Break(limited(shared, reply(), &info)))
}

/// The rejection of a denied request, counted.
fn limited<St: Store>(shared: &LayerState<St>, reply: Reply, info: &RateLimitInfo) -> Verdict<St> {
    count(shared, "limited", Some(info.binding().rule));
    reject(shared, reply, info)
}

/// The rejection of a request denied (or locked out) by `info`.
fn reject<St: Store>(shared: &LayerState<St>, reply: Reply, info: &RateLimitInfo) -> Verdict<St> {
    Verdict::Reject(respond(
        &shared.settings.body,
        reply,
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

/// The fail mode's answer to a store that failed.
fn store_failed<St: Store>(
    shared: &LayerState<St>,
    reply: Reply,
    error: StoreError,
) -> Verdict<St> {
    count(shared, "store_error", None);
    let fail = shared.settings.fail;
    tracing::warn!(target: "tower_throttle", %error, fail_mode = ?fail, "rate-limit store failed");
    match fail {
        FailMode::Open => Verdict::unchecked(shared, NotLimited::StoreFailed),
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

/// What an admitted request carries to its response: made (boxed) by the
/// check, kept by the response future.
pub(crate) struct Carried<St: Store> {
    /// The check's info, for the request's extensions and the headers.
    pub(crate) info: Option<RateLimitInfo>,
    /// The info whose fields the response gets.
    pub(crate) headers: Option<RateLimitInfo>,
    pub(crate) permits: Option<HeldPermits<St>>,
    /// The permits of an upgrade request, offered to its handler; and
    /// whether it was a `CONNECT`.
    pub(crate) upgrade: Option<(UpgradePermit, bool)>,
    /// Counted by outcome: kept or refunded once the outcome is known.
    pub(crate) charge: Option<Box<HeldCharge<St>>>,
}

impl<St: Store> Carried<St> {
    /// Whether the response has anything to do with it.
    pub(crate) fn needed(&self) -> bool {
        self.headers.is_some()
            || self.permits.is_some()
            || self.upgrade.is_some()
            || self.charge.is_some()
    }
}
