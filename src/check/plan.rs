//! The first stage: every rule's key, cost and policy for one request, in
//! one buffer ([`Plan`]), or the request's answer when a key is missing.

use std::cell::Cell;

use bytes::Bytes;
use http::Response;

use super::planned::{PlannedRule, PlannedRules};
use super::{count, LayerState, Stage};
use crate::decision::{Decision, Receipt};
use crate::grpc::{respond, Reply};
use crate::info::{RateLimitInfo, RuleDecision};
use crate::key::{bound_key_part, KeyWriter, MissingKey, RequestHead, MAX_KEY_PART};
use crate::mode::OnMissingKey;
use crate::policy::Policy;
use crate::response::Rejection;
use crate::store::{Charge, Store, StoreError};

/// The keys and costs of one request, owned so the check can outlive it.
pub(crate) struct Plan {
    pub(super) keys: Vec<u8>,
    pub(super) rules: PlannedRules,
    /// The protocol a rejection is answered in.
    pub(super) reply: Reply,
    /// Some rule's policy is still to be resolved.
    pub(super) pending: bool,
    /// The policies requests chose (see `PlannedRule::chosen`); empty for static ones.
    pub(super) chosen: Vec<Policy>,
}

thread_local! {
    /// A key buffer reused by the requests decided in process, so the hot
    /// path does not allocate one per request.
    static KEY_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// This thread's key buffer (empty), to build a request's keys in.
#[inline]
pub(super) fn take_key_buffer() -> Vec<u8> {
    KEY_BUFFER.with(Cell::take)
}

/// Returns a key buffer for the next request on this thread.
#[inline]
pub(super) fn recycle_keys(mut keys: Vec<u8>) {
    if keys.capacity() <= 4096 {
        keys.clear();
        KEY_BUFFER.with(|buffer| buffer.set(keys));
    }
}

impl Plan {
    /// Returns the key buffer for the next request on this thread.
    #[inline]
    pub(crate) fn recycle(self) {
        recycle_keys(self.keys);
    }

    pub(super) fn actives(&self) -> &[PlannedRule] {
        match &self.rules {
            PlannedRules::One(a) => std::slice::from_ref(a),
            PlannedRules::Many(v) => v,
        }
    }

    #[inline]
    pub(super) fn key(&self, a: &PlannedRule) -> &[u8] {
        &self.keys[a.start..a.end]
    }

    /// What the admitted request was charged that a refund can give back:
    /// every rule's key, policy and receipt (the slot its units were taken
    /// from), concurrency permits excepted (they are released anyway).
    pub(super) fn refundable(&self, info: &RateLimitInfo) -> Vec<(Vec<u8>, Policy, Receipt)> {
        self.actives()
            .iter()
            .zip(info.iter())
            .filter(|(_, (_, policy, _))| !policy.is_concurrency())
            .filter_map(|(a, (_, policy, d))| Some((self.key(a).to_vec(), *policy, d.receipt()?)))
            .collect()
    }

    /// Whether a delayed request may reserve a GCRA slot: at most one of
    /// its rules counts it (the others, if any, hold concurrency permits,
    /// which waiting only holds longer). With two counting rules each would
    /// count the request at its own slot while it runs at the later one, and
    /// another request could run in the earlier rule at that same instant,
    /// more than that rule allows; giving the early charge back instead
    /// could let a later waiter's slot be taken twice. Such requests wait
    /// and check again.
    pub(super) fn reservable<St>(&self, shared: &LayerState<St>) -> bool {
        let counting = self
            .actives()
            .iter()
            .filter(|a| a.cost > 0 && !self.policy(shared, a).is_concurrency());
        counting.count() <= 1
    }

    /// The policy `a` applies: the request's, or its rule's.
    pub(super) fn policy<'a, St>(
        &'a self,
        shared: &'a LayerState<St>,
        a: &PlannedRule,
    ) -> &'a Policy {
        match a.chosen {
            Some(i) => &self.chosen[i as usize],
            None => &shared.rules[a.rule].policy,
        }
    }

    pub(super) fn actives_mut(&mut self) -> &mut [PlannedRule] {
        match &mut self.rules {
            PlannedRules::One(a) => std::slice::from_mut(a),
            PlannedRules::Many(v) => v,
        }
    }
}

/// Builds every rule's key in one buffer.
#[inline]
pub(crate) fn plan<St: Store>(shared: &LayerState<St>, req: &RequestHead<'_>) -> Stage<St> {
    let n = shared.rules.len();
    let mut keys = take_key_buffer();
    keys.reserve(48 * n);
    let mut actives = Vec::new();
    let mut one = None;
    let mut chosen = Vec::new();
    let mut pending = false;
    for (i, rule) in shared.rules.iter().enumerate() {
        let start = keys.len();
        keys.extend_from_slice(&rule.key_head);
        let part = keys.len();
        if let Err(missing) = rule.key.extract(req, &mut KeyWriter::new(&mut keys)) {
            keys.truncate(start);
            match missing_key(shared, req, i, &missing) {
                Some(response) => {
                    recycle_keys(keys);
                    return Stage::Answered(response);
                }
                None => continue,
            }
        }
        bound_key_part(&mut keys, part, MAX_KEY_PART);
        let mut active = PlannedRule {
            rule: i,
            start,
            end: keys.len(),
            cost: rule.cost.of(req),
            chosen: None,
            pending: false,
        };
        if let Some(source) = &rule.source {
            super::choose::choose(rule, source, req, &mut keys, &mut chosen, &mut active);
            pending |= active.pending;
        }
        if n == 1 {
            one = Some(active);
        } else {
            actives.push(active);
        }
    }
    let rules = match (one, actives.len()) {
        (Some(a), _) => PlannedRules::One(a),
        (None, 0) => {
            recycle_keys(keys);
            return Stage::Skipped;
        }
        (None, 1) => PlannedRules::One(actives[0]),
        (None, _) => PlannedRules::Many(actives),
    };
    Stage::Check(Plan {
        keys,
        rules,
        // Set off the admitted fast path (see `evaluate::evaluate_now`), which never
        // answers itself and so need not read the `content-type`.
        reply: Reply::Http,
        pending,
        chosen,
    })
}

/// A rule found no key: `None` skips the rule (counted), `Some` is the
/// request's answer (a rejection, or the 500 of a misconfiguration).
#[cold]
#[inline(never)]
pub(super) fn missing_key<St>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
    i: usize,
    missing: &MissingKey,
) -> Option<Box<Response<Bytes>>> {
    let name = &*shared.meta.rules[i].name;
    tracing::debug!(target: "tower_throttle", rule = name, reason = missing.reason(), "no rate-limit key");
    let reply = || shared.settings.protocol.reply(req.headers());
    if missing.is_misconfiguration() {
        return Some(misconfigured(shared, reply(), i, name, missing.reason()));
    }
    match shared.settings.on_missing {
        OnMissingKey::Skip => {
            count(shared, "skipped", Some(i));
            None
        }
        OnMissingKey::Reject(status) => {
            count(shared, "missing_key", Some(i));
            let rejection = Rejection::MissingKey {
                rule: name,
                reason: missing.reason(),
                status,
            };
            Some(respond(&shared.settings.body, reply(), &rejection, false))
        }
    }
}

/// The 500 (gRPC: INTERNAL) of a key the server cannot build; the fix is
/// logged once per process, not per request (every request would repeat it).
#[cold]
fn misconfigured<St>(
    shared: &LayerState<St>,
    reply: Reply,
    i: usize,
    rule: &str,
    fix: &str,
) -> Box<Response<Bytes>> {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| {
        tracing::error!(target: "tower_throttle", rule, fix, "rate limiting is misconfigured: every request of this rule is answered 500");
    });
    count(shared, "misconfigured", Some(i));
    respond(
        &shared.settings.body,
        reply,
        &Rejection::Misconfigured { rule },
        true,
    )
}

/// A plan's rules as the store takes them: one, or all in one call.
pub(super) enum StoreRules<'a> {
    One(Charge<'a>),
    Many(Vec<Charge<'a>>),
}

/// The store's decisions for a plan's rules, in the plan's order.
pub(super) enum Decisions {
    One(Decision),
    Many(Vec<Decision>),
}

impl Plan {
    /// The plan's rules for the store, each with `policy(i, rule)`: the
    /// applied policy, or the one a delayed request reserves with.
    pub(super) fn store_rules<'a>(
        &'a self,
        policy: impl Fn(usize, &PlannedRule) -> &'a Policy,
    ) -> StoreRules<'a> {
        match &self.rules {
            PlannedRules::One(a) => StoreRules::One(Charge::new(self.key(a), policy(0, a), a.cost)),
            PlannedRules::Many(actives) => StoreRules::Many(
                actives
                    .iter()
                    .enumerate()
                    .map(|(i, a)| Charge::new(self.key(a), policy(i, a), a.cost))
                    .collect(),
            ),
        }
    }
}

impl StoreRules<'_> {
    /// Asks the store in process; `None` when it needs a future.
    #[inline]
    pub(super) fn check_now<St: Store>(&self, store: &St) -> Option<Result<Decisions, StoreError>> {
        match self {
            StoreRules::One(rule) => store.check_now(*rule).map(|d| d.map(Decisions::One)),
            StoreRules::Many(rules) => store.check_all_now(rules).map(|d| d.map(Decisions::Many)),
        }
    }

    /// Asks the store through its future.
    pub(super) async fn check<St: Store>(&self, store: &St) -> Result<Decisions, StoreError> {
        match self {
            StoreRules::One(rule) => store.check(*rule).await.map(Decisions::One),
            StoreRules::Many(rules) => store.check_all(rules).await.map(Decisions::Many),
        }
    }
}

impl Decisions {
    pub(super) fn as_mut_slice(&mut self) -> &mut [Decision] {
        match self {
            Decisions::One(d) => std::slice::from_mut(d),
            Decisions::Many(v) => v,
        }
    }

    /// The decisions with their rules and applied policies; an error when
    /// the store answered for another number of rules.
    pub(super) fn into_info<St>(
        self,
        shared: &LayerState<St>,
        plan: &Plan,
    ) -> Result<RateLimitInfo, StoreError> {
        let actives = plan.actives();
        let decided = |a: &PlannedRule, decision| RuleDecision {
            rule: a.rule,
            policy: *plan.policy(shared, a),
            decision,
        };
        match (self, actives) {
            (Decisions::One(d), [a]) => Ok(RateLimitInfo::one(shared.meta.clone(), decided(a, d))),
            (Decisions::Many(v), _) if v.len() == actives.len() => {
                let entries = actives.iter().zip(v).map(|(a, d)| decided(a, d)).collect();
                Ok(RateLimitInfo::many(shared.meta.clone(), entries))
            }
            (decisions, _) => Err(StoreError::Protocol(format!(
                "{} decisions for {} rules",
                decisions.len(),
                actives.len()
            ))),
        }
    }

    fn len(&self) -> usize {
        match self {
            Decisions::One(_) => 1,
            Decisions::Many(v) => v.len(),
        }
    }
}
