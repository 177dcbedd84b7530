//! The middle stage: asking the store, in process when it can answer at
//! once ([`decide_now`]); the asynchronous path is in `later`.

use std::time::Duration;

use super::plan::{missing_key, plan, recycle_keys, take_key_buffer, Decisions};
use super::planned::{PlannedRule, PlannedRules};
use super::settle::{settle, Step};
use super::{count, lockout, LayerState, Plan, Stage};
use crate::grpc::Reply;
use crate::info::RateLimitInfo;
use crate::key::{bound_key_part, KeyWriter, RequestHead, MAX_KEY_PART};
use crate::mode::Mode;
use crate::store::{Charge, Store, StoreError};

/// Builds the request's keys and decides at once when the store answers in
/// process and no wait is needed.
#[inline]
pub(crate) fn decide_now<St: Store>(shared: &LayerState<St>, req: &RequestHead<'_>) -> Stage<St> {
    if shared.simple {
        return decide_simple(shared, req);
    }
    if let Some(skip) = &shared.settings.skip {
        if skip(req) {
            count(shared, "bypassed", None);
            return Stage::Skipped;
        }
    }
    match plan(shared, req) {
        Stage::Check(plan) => evaluate_now(shared, plan, req),
        answered => answered,
    }
}

/// [`decide_now`] for the common layer (see `LayerState::simple`): one rule
/// with its own policy and nothing to do on an admission but forward. Its
/// key is built and checked with no `Plan` until an answer needs one.
#[inline]
fn decide_simple<St: Store>(shared: &LayerState<St>, req: &RequestHead<'_>) -> Stage<St> {
    let rule = &shared.rules[0];
    let mut keys = take_key_buffer();
    keys.extend_from_slice(&rule.key_head);
    let part = keys.len();
    if let Err(missing) = rule.key.extract(req, &mut KeyWriter::new(&mut keys)) {
        recycle_keys(keys);
        return match missing_key(shared, req, 0, &missing) {
            Some(response) => Stage::Answered(response),
            None => Stage::Skipped,
        };
    }
    bound_key_part(&mut keys, part, MAX_KEY_PART);
    let cost = rule.cost.of(req);
    let charge = Charge::new(&keys, &rule.policy, cost);
    // An admission's figures are read only by the debug log.
    let answer = if tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG) {
        shared.store.check_now(charge)
    } else {
        match shared.store.admit_now(charge) {
            Some(Ok(Some(d))) if !(d.allowed && d.permit.is_none()) => Some(Ok(d)),
            Some(Ok(_)) => {
                recycle_keys(keys);
                count(shared, "allowed", None);
                return Stage::Admitted;
            }
            Some(Err(e)) => Some(Err(e)),
            None => None,
        }
    };
    let end = keys.len();
    let plan = Plan {
        keys,
        rules: PlannedRules::One(PlannedRule {
            rule: 0,
            start: 0,
            end,
            cost,
            chosen: None,
            pending: false,
        }),
        reply: Reply::Http,
        pending: false,
        chosen: Vec::new(),
    };
    answered_now(shared, plan, req, answer.map(|a| a.map(Decisions::One)))
}

/// Decides without a future when the store answers in process and no wait
/// is needed; otherwise hands the plan on.
#[inline]
fn evaluate_now<St: Store>(
    shared: &LayerState<St>,
    mut plan: Plan,
    req: &RequestHead<'_>,
) -> Stage<St> {
    if plan.pending || matches!(shared.settings.mode, Mode::Delay { .. }) {
        // Delay mode reserves slots and may sleep, and a policy not yet
        // resolved needs its resolver: the asynchronous path.
        plan.reply = shared.settings.protocol.reply(req.headers());
        return Stage::Check(plan);
    }
    if let Some(penalty) = &shared.settings.lockout {
        // Only layers with a lock-out pay for this; the others test an `Option`.
        match lockout::locked_now(shared, penalty, &plan) {
            Some(Ok(None)) => {}
            None => {
                plan.reply = shared.settings.protocol.reply(req.headers());
                return Stage::Check(plan);
            }
            Some(answer) => {
                plan.reply = shared.settings.protocol.reply(req.headers());
                let verdict = lockout::refuse(shared, &plan, answer);
                plan.recycle();
                return Stage::Decided(verdict);
            }
        }
    }
    let answer = plan
        .store_rules(|_, a| plan.policy(shared, a))
        .check_now(&*shared.store);
    if let Some(Ok(Decisions::One(d))) = &answer {
        // The common case, admitted with nothing to carry forward:
        // no `RateLimitInfo` (and no shared-meta reference count) at all.
        if d.allowed
            && d.permit.is_none()
            && !shared.settings.info_on_allowed()
            && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
        {
            plan.recycle();
            count(shared, "allowed", None);
            return Stage::Admitted;
        }
    }
    answered_now(shared, plan, req, answer)
}

/// What a plan comes to after an in-process store answer (`None`: the
/// store needs a future), off the admitted fast path.
#[inline(never)]
fn answered_now<St: Store>(
    shared: &LayerState<St>,
    mut plan: Plan,
    req: &RequestHead<'_>,
    answer: Option<Result<Decisions, StoreError>>,
) -> Stage<St> {
    // In which protocol a rejection is answered: read only when one may follow.
    plan.reply = shared.settings.protocol.reply(req.headers());
    let Some(answer) = answer else {
        return Stage::Check(plan);
    };
    let answer: Result<RateLimitInfo, StoreError> =
        answer.and_then(|decisions| decisions.into_info(shared, &plan));
    match settle(shared, &plan, answer, Duration::ZERO, 0) {
        Step::Done(verdict) => {
            plan.recycle();
            Stage::Decided(verdict)
        }
        Step::Strike(info) => {
            let verdict = lockout::strike_now(shared, &plan, info);
            plan.recycle();
            Stage::Decided(verdict)
        }
        Step::Wait { .. } => Stage::Check(plan),
    }
}
