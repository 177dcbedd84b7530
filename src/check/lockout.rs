//! Lock-outs in the layer ([`ThrottleLayer::lockout`](crate::ThrottleLayer::lockout)):
//! every rule key of a request is looked up in the [`Penalty`] before the
//! check, and every key denied in a rejection counts a strike after it,
//! except the keys every client shares
//! ([`KeyExtractor::per_client`](crate::key::KeyExtractor::per_client)).

use std::time::Duration;

use super::planned::PlannedRule;
use super::{LayerState, Plan, Ruling};
use crate::info::{RateLimitInfo, RuleDecision};
use crate::lockout::{Penalty, Struck};
use crate::mode::Mode;
use crate::store::{budget, Reach, Store};

/// The lock-out's check of the plan's keys ([`Penalty::locks`]), before
/// the store decides: `Some(None)` when no key is locked, `Some(Some(answer))`
/// when one is (or the check failed), `None` when `reach` is [`Reach::Now`]
/// and the store answers later (a peek: nothing was read). Through the
/// store's futures it runs within the layer's timeout. A dry run checks
/// nothing.
pub(super) async fn locked<St: Store>(
    shared: &LayerState<St>,
    penalty: &Penalty,
    plan: &Plan,
    reach: Reach,
) -> Option<Option<Ruling>> {
    if shared.settings.mode == Mode::DryRun {
        return Some(None);
    }
    let lookups = penalty.locks(&*shared.store, plan.active_keys(), reach);
    let looked_up = match shared.settings.timeout.filter(|_| reach == Reach::Later) {
        Some(limit) => budget::within(limit, lookups).await,
        None => lookups.await,
    };
    Some(match looked_up {
        Ok(None) => return None,
        Ok(Some(locks)) => {
            let entries = locks
                .into_iter()
                .map(|(i, left)| entry(penalty, shared, plan, &plan.actives()[i], left))
                .collect();
            info(shared, entries).map(|info| Ruling::Locked(Box::new(info)))
        }
        Err(error) => Some(Ruling::Failed(error)),
    })
}

/// Records the strikes of a rejection: every denied key collects one, and
/// the entries of the keys a strike locked turn into the lock's denial.
/// [`Reach::Now`] records in process; were the store to need a future, the
/// strikes are recorded in the background and the rejection answers with
/// the rule's own wait.
pub(super) async fn strike<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    info: &mut RateLimitInfo,
    reach: Reach,
) {
    let Some(penalty) = &shared.settings.lockout else {
        return;
    };
    let keys = strikes(shared, plan, info);
    // Boxed: it may finish in the background.
    let recording = Box::pin(penalty.clone().strike_each(shared.store.clone(), keys));
    if let Some(struck) = reach.finish(recording).await {
        apply(info, struck);
    }
}

/// What a denial records: per denied entry, its index and its rule key.
fn strikes<St>(
    shared: &LayerState<St>,
    plan: &Plan,
    info: &RateLimitInfo,
) -> Vec<(usize, Vec<u8>)> {
    info.entries()
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.decision.allowed)
        // A key every client shares (`Global`, a route) collects no
        // strikes: one client's denials would lock out all of them.
        .filter(|(_, e)| shared.rules[e.rule].key.per_client())
        .filter_map(|(i, e)| {
            let a = plan.actives().iter().find(|a| a.rule == e.rule)?;
            Some((i, plan.key(a).to_vec()))
        })
        .collect()
}

/// Turns the entries whose strike locked their key into the lock's denial.
fn apply(info: &mut RateLimitInfo, Struck { penalty, locks }: Struck) {
    let entries = info.entries_mut();
    for (i, result) in locks {
        match result {
            Ok(None) => {}
            Ok(Some(lock)) => {
                let e = &mut entries[i];
                e.decision = penalty.lock_denial(&e.policy, lock, Some(&e.decision));
            }
            // The request is refused anyway; only its strike is lost.
            Err(error) => {
                tracing::warn!(target: "tower_throttle", %error, "could not record a rate-limit strike");
            }
        }
    }
}

fn entry<St>(
    penalty: &Penalty,
    shared: &LayerState<St>,
    plan: &Plan,
    a: &PlannedRule,
    left: Duration,
) -> RuleDecision {
    let policy = *plan.policy(shared, a);
    RuleDecision {
        rule: a.rule,
        policy,
        decision: penalty.locked(&policy, left),
        pk: plan.partition_key(shared, a),
    }
}

/// The locked rules' entries as one answer; `None` when none is locked.
fn info<St>(shared: &LayerState<St>, mut entries: Vec<RuleDecision>) -> Option<RateLimitInfo> {
    match entries.len() {
        0 => None,
        1 => Some(RateLimitInfo::one(shared.meta.clone(), entries.remove(0))),
        _ => Some(RateLimitInfo::many(shared.meta.clone(), entries)),
    }
}
