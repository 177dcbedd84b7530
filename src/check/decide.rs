//! The middle stage, [`decide`] (through the store's futures) or
//! [`decide_now`] (in process): the store's decisions for a plan's rules,
//! all or nothing, as an [`Ruling`] for `settle`.

use std::time::Duration;

use super::planned::{PlannedRule, PlannedRules};
use super::{near_limit, LayerState, Plan, Ruling};
use crate::info::{RateLimitInfo, RuleDecision};
use crate::policy::{effective_policy, rebase, Policy};
use crate::store::{budget, Decisions, Store, StoreError};

/// Asks the store for the plan's decisions through its futures, within the
/// layer's timeout; with `reserve` (delay mode), a GCRA rule reserves its
/// slot within that budget.
pub(super) async fn decide<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    reserve: Option<Duration>,
) -> Ruling {
    #[cfg(feature = "metrics")]
    let started = std::time::Instant::now();
    let call = decide_later(shared, plan, reserve);
    let answer = match shared.settings.timeout {
        Some(limit) => budget::within(limit, call).await,
        None => call.await,
    };
    #[cfg(feature = "metrics")]
    metrics::histogram!("tower_throttle_store_latency_seconds")
        .record(started.elapsed().as_secs_f64());
    answer.unwrap_or_else(Ruling::Failed)
}

/// [`decide`] in process; `None` when the store answers later (its
/// future, dropped unpolled, charged nothing). Its answers are made as
/// [`decide`]'s, by [`one`] and `many`.
#[inline]
pub(super) fn decide_now<St: Store>(shared: &LayerState<St>, plan: &Plan) -> Option<Ruling> {
    let answer = match &plan.rules {
        PlannedRules::One(a) => {
            let charge = plan.charge(a, plan.policy(shared, a));
            shared
                .store
                .decide(&[charge])
                .ready()?
                .and_then(|ds| one(shared, a.rule, ds, Duration::ZERO))
        }
        PlannedRules::Many(actives) => {
            let charges: Vec<_> = actives
                .iter()
                .map(|a| plan.charge(a, plan.policy(shared, a)))
                .collect();
            shared
                .store
                .decide(&charges)
                .ready()?
                .and_then(|ds| many(shared, plan, ds, Duration::ZERO))
        }
    };
    Some(answer.unwrap_or_else(Ruling::Failed))
}

/// [`decide`] through the store's futures, reserving with `reserve`.
async fn decide_later<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    reserve: Option<Duration>,
) -> Result<Ruling, StoreError> {
    let policies: Vec<Policy> = plan
        .actives()
        .iter()
        .map(|a| effective_policy(plan.policy(shared, a), a.cost, reserve))
        .collect();
    match &plan.rules {
        PlannedRules::One(a) => {
            let mut ds = shared.store.decide(&[plan.charge(a, &policies[0])]).await?;
            let Some(d) = ds.first_mut() else {
                return Err(one_of_none());
            };
            let wait = rebase(plan.policy(shared, a), &policies[0], d);
            one(shared, a.rule, ds, wait)
        }
        PlannedRules::Many(actives) => {
            let charges: Vec<_> = actives
                .iter()
                .zip(&policies)
                .map(|(a, used)| plan.charge(a, used))
                .collect();
            let mut decisions = shared.store.decide(&charges).await?;
            let mut wait = Duration::ZERO;
            for ((a, used), d) in actives.iter().zip(&policies).zip(decisions.iter_mut()) {
                wait = wait.max(rebase(plan.policy(shared, a), used, d));
            }
            many(shared, plan, decisions, wait)
        }
    }
}

/// The answer of `rule`'s decision, read where the store left it (a
/// decision is 112 bytes: an admission copies none); `wait` is the one of
/// its reserved slot. An error when the store answered other than one.
#[inline]
pub(super) fn one<St>(
    shared: &LayerState<St>,
    rule: usize,
    decisions: Decisions,
    wait: Duration,
) -> Result<Ruling, StoreError> {
    if admits_bare(shared, rule, &decisions, wait)? {
        return Ok(Ruling::Admitted);
    }
    Ok(Ruling::Decided(decisions, wait))
}

/// Whether `rule`'s only decision admits the request with nothing carried
/// forward, the common case: no `RateLimitInfo` (and no shared-meta
/// reference count) at all. Read in place, so that an admission moves
/// nothing. An error when the store answered other than one decision.
#[inline]
pub(super) fn admits_bare<St>(
    shared: &LayerState<St>,
    rule: usize,
    decisions: &Decisions,
    wait: Duration,
) -> Result<bool, StoreError> {
    let [d] = &decisions[..] else {
        return Err(one_of_none());
    };
    near_limit(shared, rule, d);
    Ok(d.allowed && d.permit.is_none() && wait.is_zero() && nothing_carried(shared))
}

#[cold]
pub(super) fn one_of_none() -> StoreError {
    StoreError::Protocol("other than one decision for one rule".into())
}

/// The answer of every rule's decision, in the plan's order; an error when
/// the store answered for another number of rules.
fn many<St>(
    shared: &LayerState<St>,
    plan: &Plan,
    decisions: Decisions,
    wait: Duration,
) -> Result<Ruling, StoreError> {
    let rules = plan.actives().len();
    if decisions.len() != rules {
        return Err(StoreError::Protocol(format!(
            "{} decisions for {rules} rules",
            decisions.len(),
        )));
    }
    // A denial charged nothing: its admitted rules report peeks.
    if crate::store::all_allowed(&decisions) {
        for (a, d) in plan.actives().iter().zip(&decisions) {
            near_limit(shared, a.rule, d);
        }
    }
    Ok(Ruling::Decided(decisions, wait))
}

/// The headers' and extensions' view of the store's decisions.
pub(super) fn info<St>(shared: &LayerState<St>, plan: &Plan, decided: Decisions) -> RateLimitInfo {
    let entry = |a: &PlannedRule, d| RuleDecision {
        rule: a.rule,
        policy: *plan.policy(shared, a),
        decision: d,
        pk: plan.partition_key(shared, a),
    };
    match &plan.rules {
        PlannedRules::One(a) => RateLimitInfo::one(shared.meta.clone(), entry(a, decided[0])),
        PlannedRules::Many(actives) => {
            let entries = actives
                .iter()
                .zip(decided.iter())
                .map(|(a, d)| entry(a, *d));
            RateLimitInfo::many(shared.meta.clone(), entries.collect())
        }
    }
}

/// Whether an admission carries nothing forward: no headers, request
/// extension or charge to settle, and no debug log of its figures.
#[inline]
fn nothing_carried<St>(shared: &LayerState<St>) -> bool {
    !shared.settings.info_on_allowed()
        && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
}
