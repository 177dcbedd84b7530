//! Lock-outs in the layer ([`ThrottleLayer::lockout`](crate::ThrottleLayer::lockout)):
//! every rule key of a request is looked up in the [`Penalty`] before the
//! check, and every key denied in a rejection counts a strike after it,
//! except the keys every client shares
//! ([`KeyExtractor::per_client`](crate::key::KeyExtractor::per_client)).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::settle::{limited, store_failed};
use super::{count, LayerState, Plan, Verdict};
use crate::decision::Decision;
use crate::grpc::respond;
use crate::info::{RateLimitInfo, RuleDecision};
use crate::lockout::Penalty;
use crate::mode::Mode;
use crate::response::Rejection;
use crate::store::{budget, Store, StoreError};

/// The locked rules of the plan, decided in process: `None` when the store
/// does not answer in process, `Ok(None)` when no key is locked.
pub(super) fn locked_now<St: Store>(
    shared: &LayerState<St>,
    penalty: &Penalty,
    plan: &Plan,
) -> Option<Result<Option<RateLimitInfo>, StoreError>> {
    if shared.settings.mode == Mode::DryRun {
        return Some(Ok(None));
    }
    let mut entries = Vec::new();
    for a in plan.actives() {
        match penalty.check_locked_now(&*shared.store, plan.key(a))? {
            Ok(None) => {}
            Ok(Some(left)) => entries.push(entry(penalty, a.rule, *plan.policy(shared, a), left)),
            Err(error) => return Some(Err(error)),
        }
    }
    Some(Ok(info(shared, entries)))
}

/// [`locked_now`] through the store's futures, within the layer's timeout.
async fn locked<St: Store>(
    shared: &LayerState<St>,
    penalty: &Penalty,
    plan: &Plan,
) -> Result<Option<RateLimitInfo>, StoreError> {
    if shared.settings.mode == Mode::DryRun {
        return Ok(None);
    }
    let call = async {
        let mut entries = Vec::new();
        for a in plan.actives() {
            if let Some(left) = penalty.check_locked(&*shared.store, plan.key(a)).await? {
                entries.push(entry(penalty, a.rule, *plan.policy(shared, a), left));
            }
        }
        Ok(info(shared, entries))
    };
    match shared.settings.timeout {
        Some(limit) => budget::within(limit, call).await,
        None => call.await,
    }
}

/// The asynchronous path's lock check: `Some` answers the request.
pub(super) async fn check<St: Store>(
    shared: &LayerState<St>,
    penalty: &Penalty,
    plan: &Plan,
) -> Option<Verdict<St>> {
    match locked(shared, penalty, plan).await {
        Ok(None) => None,
        answer => Some(refuse(shared, plan, answer)),
    }
}

/// Answers a request found locked (or whose lock check failed: the fail
/// mode decides). `Ok(None)` forwards it.
pub(super) fn refuse<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    answer: Result<Option<RateLimitInfo>, StoreError>,
) -> Verdict<St> {
    match answer {
        Err(error) => store_failed(shared, plan.reply, error),
        Ok(None) => Verdict::Forward {
            info: None,
            permits: None,
            charge: None,
        },
        Ok(Some(info)) => {
            count(shared, "locked", Some(info.binding().rule));
            Verdict::Reject(respond(
                &shared.settings.body,
                plan.reply,
                &Rejection::Limited(&info),
                false,
            ))
        }
    }
}

/// Records the strikes of a rejection, then rejects: with the lock's time
/// when a strike locked its key.
pub(super) async fn strike<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    mut info: RateLimitInfo,
) -> Verdict<St> {
    let Some((penalty, keys)) = strikes(shared, plan, &info) else {
        return limited(shared, plan, &info);
    };
    let results = record(shared.store.clone(), penalty, keys).await;
    apply(&mut info, results);
    limited(shared, plan, &info)
}

/// [`strike`] without a future: an in-process store records at once. Were
/// it to need a future, the strikes are recorded in the background and this
/// rejection answers with the rule's own wait.
pub(super) fn strike_now<St: Store>(
    shared: &LayerState<St>,
    plan: &Plan,
    mut info: RateLimitInfo,
) -> Verdict<St> {
    let Some((penalty, keys)) = strikes(shared, plan, &info) else {
        return limited(shared, plan, &info);
    };
    let mut recording = Box::pin(record(shared.store.clone(), penalty, keys));
    match recording
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(results) => apply(&mut info, results),
        Poll::Pending => crate::limiter::release_detached(async move {
            recording.await;
        }),
    }
    limited(shared, plan, &info)
}

/// What a denial records: the penalty and, per denied entry, its index
/// and its rule key.
type Strikes = (Arc<Penalty>, Vec<(usize, Vec<u8>)>);

fn strikes<St>(shared: &LayerState<St>, plan: &Plan, info: &RateLimitInfo) -> Option<Strikes> {
    let penalty = shared.settings.lockout.clone()?;
    let keys = info
        .entries()
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
        .collect();
    Some((penalty, keys))
}

type Recorded = (
    Arc<Penalty>,
    Vec<(usize, Result<Option<Duration>, StoreError>)>,
);

/// Owns what it needs, so that it can finish in the background.
async fn record<St: Store>(
    store: Arc<St>,
    penalty: Arc<Penalty>,
    keys: Vec<(usize, Vec<u8>)>,
) -> Recorded {
    let mut results = Vec::with_capacity(keys.len());
    for (i, key) in keys {
        results.push((i, penalty.record_denial(&*store, &key).await));
    }
    (penalty, results)
}

/// Turns the entries whose strike locked their key into the lock's denial.
fn apply(info: &mut RateLimitInfo, (penalty, results): Recorded) {
    let entries = info.entries_mut();
    for (i, result) in results {
        match result {
            Ok(None) => {}
            Ok(Some(lock)) => {
                let e = &mut entries[i];
                e.decision = Decision {
                    decided_by: e.decision.decided_by,
                    ..penalty.locked(&e.policy, lock)
                };
            }
            // The request is refused anyway; only its strike is lost.
            Err(error) => {
                tracing::warn!(target: "tower_throttle", %error, "could not record a rate-limit strike");
            }
        }
    }
}

fn entry(penalty: &Penalty, rule: usize, policy: crate::Policy, left: Duration) -> RuleDecision {
    RuleDecision {
        rule,
        policy,
        decision: penalty.locked(&policy, left),
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
