//! One request's check, one pipeline in three stages, each in the file of
//! its name, in an in-process form (`_now`) and a form through the store's
//! futures that share their logic:
//!
//! - [`plan`] builds every rule's key, cost and policy (a [`Plan`]);
//! - [`decide_now`] / [`decide`] asks the store for its decisions (an
//!   [`Ruling`]);
//! - [`settle_now`] / [`settle`] applies the layer's mode to the answer (a
//!   [`Verdict`], or a wait in delay mode), recording a lock-out's strikes.
//!
//! [`now`] runs them in process, where most requests end; a plan that needs
//! a future (a remote store, a resolver, delay mode) goes on in [`later`].
//! The lock-out's store calls take a [`Reach`]: at once, or through the
//! store's futures. A layer of one plain rule takes the fast lane of
//! `simple`, which settles any answer but a bare admission like every other.

use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::decision::Decision;
use crate::grpc::Reply;
use crate::info::{Meta, RateLimitInfo};
use crate::key::RequestHead;
use crate::limiter::{Reservation, WaitBudget};
use crate::mode::Mode;
use crate::rule::RuleCfg;
use crate::settings::Settings;
use crate::store::{Decisions, Reach, Store, StoreError};

mod charge;
mod choose;
mod decide;
mod hold;
mod lockout;
mod permits;
mod plan;
mod planned;
mod settle;
mod simple;

pub(crate) use charge::HeldCharge;
use decide::{decide, decide_now};
pub(crate) use hold::Holds;
pub(crate) use permits::HeldPermits;
use plan::plan;
pub(crate) use plan::Plan;
use settle::{settle, settle_now};
pub(crate) use settle::{Carried, Verdict};

/// Everything a layer's services share.
pub(crate) struct LayerState<St> {
    pub(crate) store: Arc<St>,
    /// Hold times and releases of this layer's concurrency permits.
    pub(crate) holds: Arc<Holds>,
    pub(crate) rules: Box<[RuleCfg]>,
    pub(crate) meta: Arc<Meta>,
    pub(crate) settings: Settings,
    /// One rule (its own policy or the request's), no skip, lock-out or
    /// delay, and nothing an admission carries forward: [`now`] takes the
    /// fast lane of `simple` (see [`Settings::simple`]).
    pub(crate) simple: bool,
    /// No admission's figures are read but by a debug log: `simple` asks
    /// the store for a bare admission ([`Charge::without_figures`]) while
    /// no debug subscriber listens.
    ///
    /// [`Charge::without_figures`]: crate::store::Charge::without_figures
    pub(crate) spares_figures: bool,
    /// A simple layer whose denials are answered with the default
    /// plain-text 429 and need no estimate of a release (not a concurrency
    /// limit): `simple` renders the common one straight from the store's
    /// decision.
    pub(crate) plain_denials: bool,
    /// Keeps the layer's key namespaces claimed in the store while any of
    /// its services lives.
    pub(crate) _owner: Arc<()>,
    /// The `prefix` label of the metrics ("" without a prefix).
    #[cfg(feature = "metrics")]
    pub(crate) metric_prefix: Arc<str>,
    /// The `rule` label of outcomes about every rule: the names, `+`-joined.
    #[cfg(feature = "metrics")]
    pub(crate) metric_rules: Arc<str>,
}

/// The store's answer for a plan, for [`settle`].
pub(super) enum Ruling {
    /// Every rule admitted the request, and nothing of it is carried
    /// forward: no [`RateLimitInfo`] is built.
    Admitted,
    /// The rules' decisions, and how long a delayed request waits for the
    /// slots it reserved.
    Decided(Decisions, Duration),
    /// A key is locked out: these are its lock's denials.
    Locked(Box<RateLimitInfo>),
    /// The store failed (or timed out).
    Failed(StoreError),
}

/// Checks a request in process: the fast lane, or [`plan`], the lock-out's
/// check, [`decide_now`] and [`settle_now`]. `Break` is
/// the request's verdict ([`Verdict::forward`] when nothing is carried:
/// admitted, or not limited); `Continue` a plan only the store's futures
/// can decide, for [`later`].
#[inline]
pub(crate) fn now<St: Store>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
) -> ControlFlow<Verdict<St>, Plan> {
    if shared.simple {
        return simple::check(shared, req);
    }
    let plan = plan(shared, req)?;
    if plan.pending || matches!(shared.settings.mode, Mode::Delay { .. }) {
        // A policy not yet resolved needs its resolver, and delay mode
        // reserves slots and may sleep.
        return ControlFlow::Continue(plan);
    }
    let answer = match &shared.settings.lockout {
        // Only layers with a lock-out pay for this; the others test an `Option`.
        Some(_) => locked_now(shared, &plan),
        None => decide_now(shared, &plan),
    };
    match answer {
        Some(Ruling::Admitted) => {
            // The common case, settled without a future.
            count(shared, "allowed", None);
            plan.recycle();
            ControlFlow::Break(Verdict::forward())
        }
        Some(answer) => settled_now(shared, plan, req, answer),
        // Nothing was charged: every call of a check is answered in
        // process or none is.
        None => ControlFlow::Continue(plan),
    }
}

/// The lock-out's check of the plan in process, then the store's decisions
/// if no key is locked.
#[inline(never)]
fn locked_now<St: Store>(shared: &LayerState<St>, plan: &Plan) -> Option<Ruling> {
    let penalty = shared.settings.lockout.as_ref()?;
    match poll_now(std::pin::pin!(lockout::locked(
        shared,
        penalty,
        plan,
        Reach::Now
    )))? {
        Some(locked) => Some(locked),
        None => decide_now(shared, plan),
    }
}

/// [`settle_now`]s an answer the store gave in process, off the admitted
/// path.
#[inline(never)]
fn settled_now<St: Store>(
    shared: &LayerState<St>,
    plan: Plan,
    req: &RequestHead<'_>,
    answer: Ruling,
) -> ControlFlow<Verdict<St>, Plan> {
    // In which protocol a rejection is answered: read only when one may follow.
    let reply = || shared.settings.protocol.reply(req.headers());
    let verdict = settle_now(shared, &plan, answer, &reply);
    plan.recycle();
    ControlFlow::Break(verdict)
}

/// Polls a [`Reach::Now`] future, which never waits, to its end (pinned
/// where it was made: moving a future copies every state of it).
#[inline]
fn poll_now<F: Future>(stage: Pin<&mut F>) -> F::Output {
    match stage.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("an in-process check waited"),
    }
}

/// Checks a plan through the store's futures ([`Reach::Later`]): resolves
/// its pending policies, checks the lock-out, then [`decide`]s and
/// [`settle`]s, waiting and deciding again in delay mode. `reply` is the
/// request's protocol.
pub(crate) async fn later<St: Store>(
    shared: Arc<LayerState<St>>,
    mut plan: Plan,
    reply: Reply,
) -> Verdict<St> {
    plan.resolve_pending(&shared).await;
    let (shared, plan, reach, reply) = (&*shared, &plan, Reach::Later, &move || reply);
    let mut locked = match &shared.settings.lockout {
        Some(penalty) => lockout::locked(shared, penalty, plan, reach)
            .await
            .flatten(),
        None => None,
    };
    let delay = match shared.settings.mode {
        Mode::Delay { max_wait } => Some(max_wait),
        _ => None,
    };
    let mut budget = WaitBudget::new(delay.unwrap_or_default());
    loop {
        let reserve = delay
            .filter(|_| shared.store.reserves_slots() && plan.reservable(shared))
            .map(|_| budget.left());
        // Registered before the check, so a release between the check and
        // the wait still wakes this request.
        let concurrency = plan
            .actives()
            .iter()
            .filter(|a| plan.policy(shared, a).is_concurrency())
            .map(|a| plan.key(a));
        let mut released = std::pin::pin!(shared.holds.released(concurrency).notified());
        released.as_mut().enable();
        let answer = match locked.take() {
            Some(answer) => answer,
            None => decide(shared, plan, reserve).await,
        };
        let slot_wait = match &answer {
            Ruling::Decided(_, wait) => *wait,
            _ => Duration::ZERO,
        };
        let pause = match settle(shared, plan, answer, &budget, reply).await {
            ControlFlow::Break(verdict) => {
                if let (false, Verdict::Forward(carried)) = (slot_wait.is_zero(), &verdict) {
                    let info = carried.as_ref().and_then(|c| c.info.as_ref());
                    // Admitted into a reserved slot: wait for it, then go. A
                    // waiter dropped before its time gives the slot back.
                    count(shared, "delayed", None);
                    let charged = info.map(|info| plan.refundable(info)).unwrap_or_default();
                    let reserved = Reservation::new(shared.store.clone(), charged);
                    tokio::time::sleep(slot_wait).await;
                    reserved.keep();
                }
                return verdict;
            }
            ControlFlow::Continue(pause) => pause,
        };
        // Woken by this layer's next release, or by the estimate running
        // out (a permit of another instance, a lapsed lease).
        budget.take(pause, Some(released)).await;
    }
}

/// Counts an admission that left `rule` near its limit (feature
/// `metrics`): more than the layer's near-limit ratio of the limit used
/// ([`ThrottleLayer::near_limit_ratio`](crate::ThrottleLayer)), labelled
/// with the applied limit (a resolver's tiers are as many series).
#[inline]
pub(super) fn near_limit<St>(shared: &LayerState<St>, rule: usize, d: &Decision) {
    #[cfg(feature = "metrics")]
    if d.allowed && shared.settings.counts_near_limit() {
        let used = d.limit.saturating_sub(d.remaining);
        // Whole units, as Envoy's rate-limit service counts: with 0.8, the
        // 5th of 5 and the 81st of 100.
        let threshold = (d.limit as f64 * shared.settings.near_limit) as u64;
        if used > threshold {
            metrics::counter!(
                "tower_throttle_near_limit_total",
                "prefix" => shared.metric_prefix.clone(),
                "rule" => shared.meta.rules[rule].name.clone(),
                "limit" => d.limit.to_string()
            )
            .increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (shared, rule, d);
}

/// Counts a request's outcome (feature `metrics`), labelled with the
/// layer's prefix (empty when none) and the rule that decided it: the one
/// that denied or found no key, or every rule's name joined with `+` when
/// the request as a whole was admitted or the store failed. Labels come
/// from configuration only, never from requests: the series are bounded by
/// outcomes × layers × rules.
#[inline]
pub(super) fn count<St>(shared: &LayerState<St>, outcome: &'static str, rule: Option<usize>) {
    #[cfg(feature = "metrics")]
    {
        let rule = rule.map_or_else(
            || shared.metric_rules.clone(),
            |i| shared.meta.rules[i].name.clone(),
        );
        metrics::counter!(
            "tower_throttle_requests_total",
            "outcome" => outcome,
            "prefix" => shared.metric_prefix.clone(),
            "rule" => rule
        )
        .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (shared, outcome, rule);
}
