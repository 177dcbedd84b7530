//! The first stage, [`plan`]: every rule's key, cost and policy for one
//! request, in one buffer ([`Plan`]), or the request's answer when it is
//! not limited or a key is missing.

use std::cell::Cell;
use std::ops::ControlFlow;

use bytes::Bytes;
use http::Response;

use super::choose::{apply, choose, resolve};
use super::planned::{PlannedRule, PlannedRules};
use super::{count, LayerState, Verdict};
use crate::decision::Receipt;
use crate::grpc::{respond, Reply};
use crate::info::{NotLimited, RateLimitInfo};
use crate::key::{bound_key_part, KeyWriter, MissingKey, RequestHead, MAX_KEY_PART};
use crate::mode::OnMissingKey;
use crate::policy::Policy;
use crate::response::Rejection;
use crate::rule::RuleCfg;
use crate::store::{Charge, Store};

/// The keys and costs of one request, owned so the check can outlive it.
pub(crate) struct Plan {
    keys: Vec<u8>,
    pub(super) rules: PlannedRules,
    /// Some rule's policy is still to be resolved.
    pub(super) pending: bool,
    /// The policies requests chose (see `PlannedRule::chosen`); empty for static ones.
    chosen: Vec<Policy>,
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
    /// The plan of the one rule of a layer's fast lane, its key in `keys`.
    pub(super) fn one(keys: Vec<u8>, cost: u64, chosen: Option<Policy>) -> Self {
        let end = keys.len();
        Plan {
            keys,
            rules: PlannedRules::One(PlannedRule {
                rule: 0,
                start: 0,
                end,
                cost,
                chosen: chosen.map(|_| 0),
                pending: false,
            }),
            pending: false,
            chosen: chosen.into_iter().collect(),
        }
    }

    /// The plan of a one-rule layer whose policy only its resolver knows.
    pub(super) fn pending(keys: Vec<u8>, cost: u64) -> Self {
        let mut plan = Plan::one(keys, cost, None);
        plan.pending = true;
        if let PlannedRules::One(a) = &mut plan.rules {
            a.pending = true;
        }
        plan
    }

    /// Returns the key buffer for the next request on this thread.
    #[inline]
    pub(super) fn recycle(self) {
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

    /// Every active rule's key, in order.
    pub(super) fn active_keys(&self) -> impl Iterator<Item = &[u8]> + Send + '_ {
        self.actives().iter().map(|a| self.key(a))
    }

    /// The `pk` of `a`'s key part, when the layer writes partition keys.
    pub(super) fn partition_key<St>(
        &self,
        shared: &LayerState<St>,
        a: &PlannedRule,
    ) -> Option<crate::response::fields::Pk> {
        let keys = shared.meta.partition.as_ref()?;
        Some(keys.of(self.key_part(&shared.rules[a.rule], a)))
    }

    /// The key part of `a` (its key without the rule's `prefix:name:`).
    fn key_part(&self, rule: &RuleCfg, a: &PlannedRule) -> &[u8] {
        &self.keys[a.start + rule.key_head.len()..a.end]
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

    /// What the store charges `a`, under `policy` (the applied one, or the
    /// one a delayed request reserves with).
    #[inline]
    pub(super) fn charge<'a>(&'a self, a: &PlannedRule, policy: &'a Policy) -> Charge<'a> {
        Charge::new(self.key(a), policy, a.cost)
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

    /// Asks the resolvers of the plan's pending rules (within the layer's
    /// store timeout, if any). A resolver that fails or times out leaves the
    /// rule's own policy, with a warning.
    pub(super) async fn resolve_pending<St>(&mut self, shared: &LayerState<St>) {
        if !self.pending {
            return;
        }
        self.pending = false;
        // How far the keys moved: a chosen policy may tag an earlier key.
        let mut shift = 0;
        for i in 0..self.actives().len() {
            let mut active = self.actives()[i];
            active.start += shift;
            active.end += shift;
            if active.pending {
                active.pending = false;
                let rule = &shared.rules[active.rule];
                if let Some(policy) = resolve(shared, rule, self.key_part(rule, &active)).await {
                    shift += apply(rule, policy, &mut self.keys, &mut self.chosen, &mut active);
                }
            }
            match &mut self.rules {
                PlannedRules::One(a) => *a = active,
                PlannedRules::Many(v) => v[i] = active,
            }
        }
    }
}

/// Builds every rule's key in one buffer and picks its policy; `Break` is
/// the request's answer when it is not limited (`skip_if`, every rule
/// skipped for want of a key) or a key is missing.
#[inline]
pub(super) fn plan<St: Store>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
) -> ControlFlow<Verdict<St>, Plan> {
    if let Some(skip) = &shared.settings.skip {
        if skip(req) {
            count(shared, "bypassed", None);
            return ControlFlow::Break(Verdict::unchecked(shared, NotLimited::Skipped));
        }
    }
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
                Some(verdict) => {
                    recycle_keys(keys);
                    return ControlFlow::Break(verdict);
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
            choose(rule, source, req, &mut keys, &mut chosen, &mut active);
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
            return ControlFlow::Break(Verdict::unchecked(shared, NotLimited::NoKey));
        }
        (None, 1) => PlannedRules::One(actives[0]),
        (None, _) => PlannedRules::Many(actives),
    };
    ControlFlow::Continue(Plan {
        keys,
        rules,
        pending,
        chosen,
    })
}

/// A rule found no key: `None` skips the rule (counted), `Some` is the
/// request's answer (a rejection, or the 500 of a misconfiguration).
#[cold]
#[inline(never)]
pub(super) fn missing_key<St: Store>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
    i: usize,
    missing: &MissingKey,
) -> Option<Verdict<St>> {
    let name = &*shared.meta.rules[i].name;
    tracing::debug!(target: "tower_throttle", rule = name, reason = missing.reason(), "no rate-limit key");
    let reply = || shared.settings.protocol.reply(req.headers());
    if missing.is_misconfiguration() {
        let response = misconfigured(shared, reply(), i, name, missing);
        return Some(Verdict::Reject(response));
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
            let response = respond(&shared.settings.body, reply(), &rejection, false);
            Some(Verdict::Reject(response))
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
    missing: &MissingKey,
) -> Box<Response<Bytes>> {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    let fix = missing.reason();
    LOGGED.call_once(|| {
        tracing::error!(target: "tower_throttle", rule, fix, "rate limiting is misconfigured: every request of this rule is answered 500");
    });
    count(shared, "misconfigured", Some(i));
    respond(
        &shared.settings.body,
        reply,
        &Rejection::Misconfigured {
            rule,
            explanation: missing.explanation(),
        },
        true,
    )
}
