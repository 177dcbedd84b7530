//! One request's evaluation: build the keys, ask the store once, apply the mode.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use crate::grpc::{respond, Reply, ResponseProtocol};
use crate::info::{Entry, Meta, RateLimitInfo};
use crate::key::{bound_key_part, KeyWriter, MissingKey, RequestHead, MAX_KEY_PART};
use crate::lockout::Penalty;
use crate::mode::{FailMode, Mode, OnMissingKey, MAX_DELAY_ATTEMPTS};
use crate::policy::Policy;
use crate::response::{BodyFormat, Rejection};
use crate::rule::RuleCfg;

mod charge;
mod choose;
mod hold;
mod later;
mod lockout;
mod permits;

use crate::store::{Rule, Store, StoreError};
pub(crate) use charge::{Charge, CountIf};
pub(crate) use hold::Holds;
pub(crate) use later::evaluate;
pub(crate) use later::{effective_policy, rebase};
pub(crate) use permits::Permits;

/// Everything a layer's services share.
pub(crate) struct Shared<St> {
    pub(crate) store: Arc<St>,
    /// Hold times and releases of this layer's concurrency permits.
    pub(crate) holds: Arc<Holds>,
    pub(crate) rules: Box<[RuleCfg]>,
    pub(crate) meta: Arc<Meta>,
    pub(crate) settings: Settings,
    /// One rule with its own policy, no skip, lock-out or delay, and nothing
    /// an admission carries forward: [`decide_now`] takes its short path.
    pub(crate) simple: bool,
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

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) mode: Mode,
    pub(crate) fail: FailMode,
    pub(crate) timeout: Option<Duration>,
    pub(crate) on_missing: OnMissingKey,
    pub(crate) body: BodyFormat,
    pub(crate) headers_on_allowed: bool,
    pub(crate) request_info: bool,
    pub(crate) ietf_headers: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) legacy_reset: crate::response::ResetFormat,
    pub(crate) protocol: ResponseProtocol,
    /// Requests that bypass the layer.
    pub(crate) skip: Option<Skip>,
    /// Which responses keep their charge; the others are refunded.
    pub(crate) count_if: Option<CountIf>,
    /// Locks rule keys out after repeated denials.
    pub(crate) lockout: Option<Arc<Penalty>>,
}

/// A predicate of [`ThrottleLayer::skip_if`](crate::ThrottleLayer::skip_if).
pub(crate) type Skip = Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Reject,
            fail: FailMode::Closed,
            timeout: None,
            on_missing: OnMissingKey::default(),
            body: BodyFormat::PlainText,
            headers_on_allowed: false,
            request_info: false,
            ietf_headers: true,
            legacy_headers: false,
            legacy_reset: Default::default(),
            protocol: ResponseProtocol::default(),
            skip: None,
            count_if: None,
            lockout: None,
        }
    }
}

impl Settings {
    /// Whether `rules` under these settings make a simple layer (see
    /// `Shared::simple`).
    pub(crate) fn simple(&self, rules: &[RuleCfg]) -> bool {
        matches!(rules, [rule] if rule.source.is_none())
            && self.skip.is_none()
            && self.lockout.is_none()
            && !matches!(self.mode, Mode::Delay { .. })
            && !self.info_on_allowed()
    }

    /// Whether an admitted request needs its [`RateLimitInfo`] (for the
    /// request extension or the response headers).
    pub(crate) fn info_on_allowed(&self) -> bool {
        let f = self.forwarding();
        f.headers || f.request_info || self.count_if.is_some()
    }

    /// What an admitted request carries forward.
    pub(crate) fn forwarding(&self) -> Forwarding {
        Forwarding {
            headers: self.headers_on_allowed || self.mode == Mode::DryRun,
            request_info: self.request_info,
        }
    }
}

/// What an admitted request carries forward.
#[derive(Clone, Copy)]
pub(crate) struct Forwarding {
    /// The response gets the rate-limit headers.
    pub(crate) headers: bool,
    /// The request gets the [`RateLimitInfo`] extension.
    pub(crate) request_info: bool,
}

/// A rule to check: its index, its key in the plan's buffer, its cost and
/// the policy applied.
#[derive(Clone, Copy)]
struct Active {
    rule: usize,
    start: usize,
    end: usize,
    cost: u64,
    /// The request's own policy (an index into `Plan::chosen`), when it is
    /// not the rule's: kept out of line, so a static policy copies nothing.
    chosen: Option<u32>,
    /// The policy is still to be resolved (asynchronously).
    pending: bool,
}

enum ActiveRules {
    One(Active),
    Many(Vec<Active>),
}

/// The keys and costs of one request, owned so the check can outlive it.
pub(crate) struct Plan {
    keys: Vec<u8>,
    rules: ActiveRules,
    /// The protocol a rejection is answered in.
    reply: Reply,
    /// Some rule's policy is still to be resolved.
    pending: bool,
    /// The policies requests chose (see `Active::chosen`); empty for static ones.
    chosen: Vec<Policy>,
}

thread_local! {
    /// A key buffer reused by the requests decided in process, so the hot
    /// path does not allocate one per request.
    static KEY_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Returns a key buffer for the next request on this thread.
#[inline]
fn recycle_keys(mut keys: Vec<u8>) {
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

    fn actives(&self) -> &[Active] {
        match &self.rules {
            ActiveRules::One(a) => std::slice::from_ref(a),
            ActiveRules::Many(v) => v,
        }
    }

    #[inline]
    fn key(&self, a: &Active) -> &[u8] {
        &self.keys[a.start..a.end]
    }

    /// What the request was charged that a refund can give back: every
    /// rule's (key, policy, cost), concurrency permits excepted (they are
    /// released anyway).
    fn refundable<St>(&self, shared: &Shared<St>) -> Vec<(Vec<u8>, Policy, u64)> {
        self.actives()
            .iter()
            .map(|a| (a, self.policy(shared, a)))
            .filter(|(a, policy)| a.cost > 0 && !policy.is_concurrency())
            .map(|(a, policy)| (self.key(a).to_vec(), *policy, a.cost))
            .collect()
    }

    /// The policy `a` applies: the request's, or its rule's.
    fn policy<'a, St>(&'a self, shared: &'a Shared<St>, a: &Active) -> &'a Policy {
        match a.chosen {
            Some(i) => &self.chosen[i as usize],
            None => &shared.rules[a.rule].policy,
        }
    }

    fn actives_mut(&mut self) -> &mut [Active] {
        match &mut self.rules {
            ActiveRules::One(a) => std::slice::from_mut(a),
            ActiveRules::Many(v) => v,
        }
    }
}

pub(crate) enum Planned {
    Check(Plan),
    /// Every rule was skipped for want of a key.
    Skip,
    Reject(Box<Response<Bytes>>),
}

/// Builds every rule's key in one buffer.
#[inline]
pub(crate) fn plan<St>(shared: &Shared<St>, req: &RequestHead<'_>) -> Planned {
    let n = shared.rules.len();
    let mut keys = KEY_BUFFER.with(Cell::take);
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
                    return Planned::Reject(response);
                }
                None => continue,
            }
        }
        bound_key_part(&mut keys, part, MAX_KEY_PART);
        let mut active = Active {
            rule: i,
            start,
            end: keys.len(),
            cost: rule.cost.of(req),
            chosen: None,
            pending: false,
        };
        if let Some(source) = &rule.source {
            choose::choose(rule, source, req, &mut keys, &mut chosen, &mut active);
            pending |= active.pending;
        }
        if n == 1 {
            one = Some(active);
        } else {
            actives.push(active);
        }
    }
    let rules = match (one, actives.len()) {
        (Some(a), _) => ActiveRules::One(a),
        (None, 0) => {
            recycle_keys(keys);
            return Planned::Skip;
        }
        (None, 1) => ActiveRules::One(actives[0]),
        (None, _) => ActiveRules::Many(actives),
    };
    Planned::Check(Plan {
        keys,
        rules,
        // Set off the admitted fast path (see `evaluate_now`), which never
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
fn missing_key<St>(
    shared: &Shared<St>,
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
            Some(respond(&shared.settings, reply(), &rejection, false))
        }
    }
}

/// What to do with the request.
// Lives for one step on the stack before the response future boxes what an
// admission carries; boxing `Forward` here would allocate on every
// admitted request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Outcome<St: Store> {
    Forward {
        info: Option<RateLimitInfo>,
        permits: Option<Permits<St>>,
        /// Counted by outcome: the charge to keep or refund.
        charge: Option<Box<Charge<St>>>,
    },
    Reject(Box<Response<Bytes>>),
}

/// What to do after one store answer.
#[allow(clippy::large_enum_variant)]
enum Step<St: Store> {
    Done(Outcome<St>),
    /// Delay mode: wait this long (or, with `on_release`, until this layer
    /// releases a permit, if sooner), then check again.
    Wait {
        wait: Duration,
        on_release: bool,
    },
    /// A rejection under a lock-out: its denial is to be recorded first
    /// (see [`lockout`]), which may lock the key.
    Strike(RateLimitInfo),
}

/// Applies the mode to one store answer; `waited` and `attempts` count the
/// delays so far.
fn settle<St: Store>(
    shared: &Shared<St>,
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
        let permits = Permits::collect(shared, plan, &info);
        let charge = Charge::collect(shared, plan);
        return Step::Done(Outcome::Forward {
            info: Some(info),
            permits,
            charge,
        });
    }
    match shared.settings.mode {
        Mode::DryRun => {
            count(shared, "dry_run_limited", Some(info.binding().rule));
            tracing::info!(target: "tower_throttle", retry_after = ?info.retry_after(), "dry run: request would be rate-limited");
            return Step::Done(Outcome::Forward {
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
fn limited<St: Store>(shared: &Shared<St>, plan: &Plan, info: &RateLimitInfo) -> Outcome<St> {
    count(shared, "limited", Some(info.binding().rule));
    Outcome::Reject(respond(
        &shared.settings,
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

/// What a request's check came to before any future.
pub(crate) enum Now<St: Store> {
    /// Admitted in process, with nothing to carry forward: the hot path.
    Admitted,
    /// Every rule was skipped for want of a key.
    Skip,
    /// Rejected before any check (a missing key).
    Reject(Box<Response<Bytes>>),
    /// Decided in process, with something to carry forward or a rejection.
    Decided(Outcome<St>),
    /// Needs [`evaluate`]: an asynchronous store, or delay mode.
    Later(Plan),
}

/// Builds the request's keys and decides at once when the store answers in
/// process and no wait is needed.
#[inline]
pub(crate) fn decide_now<St: Store>(shared: &Shared<St>, req: &RequestHead<'_>) -> Now<St> {
    if shared.simple {
        return decide_simple(shared, req);
    }
    if let Some(skip) = &shared.settings.skip {
        if skip(req) {
            count(shared, "bypassed", None);
            return Now::Skip;
        }
    }
    match plan(shared, req) {
        Planned::Check(plan) => evaluate_now(shared, plan, req),
        Planned::Skip => Now::Skip,
        Planned::Reject(response) => Now::Reject(response),
    }
}

/// [`decide_now`] for the common layer (see `Shared::simple`): one rule
/// with its own policy and nothing to do on an admission but forward. Its
/// key is built and checked with no `Plan` until an answer needs one.
#[inline]
fn decide_simple<St: Store>(shared: &Shared<St>, req: &RequestHead<'_>) -> Now<St> {
    let rule = &shared.rules[0];
    let mut keys = KEY_BUFFER.with(Cell::take);
    keys.extend_from_slice(&rule.key_head);
    let part = keys.len();
    if let Err(missing) = rule.key.extract(req, &mut KeyWriter::new(&mut keys)) {
        recycle_keys(keys);
        return match missing_key(shared, req, 0, &missing) {
            Some(response) => Now::Reject(response),
            None => Now::Skip,
        };
    }
    bound_key_part(&mut keys, part, MAX_KEY_PART);
    let cost = rule.cost.of(req);
    let answer = shared
        .store
        .check_now(Rule::new(&keys, &rule.policy, cost));
    if let Some(Ok(d)) = &answer {
        if d.allowed
            && d.permit.is_none()
            && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
        {
            recycle_keys(keys);
            count(shared, "allowed", None);
            return Now::Admitted;
        }
    }
    let end = keys.len();
    let plan = Plan {
        keys,
        rules: ActiveRules::One(Active {
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
    answered_now(shared, plan, req, answer.map(|a| a.map(|d| (d, rule.policy))))
}

/// Decides without a future when the store answers in process and no wait
/// is needed; otherwise hands the plan on.
#[inline]
fn evaluate_now<St: Store>(shared: &Shared<St>, mut plan: Plan, req: &RequestHead<'_>) -> Now<St> {
    // In which protocol a rejection is answered: read only when one may follow.
    let reply = || shared.settings.protocol.reply(req.headers());
    if plan.pending || matches!(shared.settings.mode, Mode::Delay { .. }) {
        // Delay mode reserves slots and may sleep, and a policy not yet
        // resolved needs its resolver: the asynchronous path.
        plan.reply = reply();
        return Now::Later(plan);
    }
    if let Some(penalty) = &shared.settings.lockout {
        // Only layers with a lock-out pay for this; the others test an `Option`.
        match lockout::locked_now(shared, penalty, &plan) {
            Some(Ok(None)) => {}
            None => {
                plan.reply = reply();
                return Now::Later(plan);
            }
            Some(answer) => {
                plan.reply = reply();
                let outcome = lockout::refuse(shared, &plan, answer);
                plan.recycle();
                return Now::Decided(outcome);
            }
        }
    }
    match &plan.rules {
        ActiveRules::One(a) => {
            let policy = *plan.policy(shared, a);
            let rule = Rule::new(plan.key(a), &policy, a.cost);
            let answer = shared.store.check_now(rule);
            if let Some(Ok(d)) = &answer {
                // The common case, admitted with nothing to carry forward:
                // no `RateLimitInfo` (and no shared-meta reference count) at all.
                if d.allowed
                    && d.permit.is_none()
                    && !shared.settings.info_on_allowed()
                    && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG)
                {
                    plan.recycle();
                    count(shared, "allowed", None);
                    return Now::Admitted;
                }
            }
            answered_now(shared, plan, req, answer.map(|a| a.map(|d| (d, policy))))
        }
        ActiveRules::Many(actives) => {
            let rules: Vec<Rule<'_>> = actives
                .iter()
                .map(|a| Rule::new(plan.key(a), plan.policy(shared, a), a.cost))
                .collect();
            let Some(decisions) = shared.store.check_all_now(&rules) else {
                drop(rules);
                plan.reply = reply();
                return Now::Later(plan);
            };
            drop(rules);
            let answer = decisions.and_then(|decisions| many(shared, &plan, decisions));
            plan.reply = reply();
            settled_now(shared, plan, answer)
        }
    }
}

/// What a one-rule plan comes to after an in-process store answer (`None`:
/// the store needs a future), off the admitted fast path.
#[inline(never)]
fn answered_now<St: Store>(
    shared: &Shared<St>,
    mut plan: Plan,
    req: &RequestHead<'_>,
    answer: Option<Result<(crate::Decision, Policy), StoreError>>,
) -> Now<St> {
    plan.reply = shared.settings.protocol.reply(req.headers());
    let Some(answer) = answer else {
        return Now::Later(plan);
    };
    let ActiveRules::One(a) = &plan.rules else {
        unreachable!("a one-rule answer");
    };
    let answer = answer.map(|(decision, policy)| {
        RateLimitInfo::one(
            shared.meta.clone(),
            Entry {
                rule: a.rule,
                policy,
                decision,
            },
        )
    });
    settled_now(shared, plan, answer)
}

/// Applies the mode to an in-process answer.
fn settled_now<St: Store>(
    shared: &Shared<St>,
    plan: Plan,
    answer: Result<RateLimitInfo, StoreError>,
) -> Now<St> {
    match settle(shared, &plan, answer, Duration::ZERO, 0) {
        Step::Done(outcome) => {
            plan.recycle();
            Now::Decided(outcome)
        }
        Step::Strike(info) => {
            let outcome = lockout::strike_now(shared, &plan, info);
            plan.recycle();
            Now::Decided(outcome)
        }
        Step::Wait { .. } => Now::Later(plan),
    }
}

fn many<St>(
    shared: &Shared<St>,
    plan: &Plan,
    decisions: Vec<crate::Decision>,
) -> Result<RateLimitInfo, StoreError> {
    let actives = plan.actives();
    if decisions.len() != actives.len() {
        return Err(StoreError::Protocol(format!(
            "{} decisions for {} rules",
            decisions.len(),
            actives.len()
        )));
    }
    let entries = actives
        .iter()
        .zip(decisions)
        .map(|(a, decision)| Entry {
            rule: a.rule,
            policy: *plan.policy(shared, a),
            decision,
        })
        .collect();
    Ok(RateLimitInfo::many(shared.meta.clone(), entries))
}

/// The 500 (gRPC: INTERNAL) of a key the server cannot build; the fix is
/// logged once per process, not per request (every request would repeat it).
#[cold]
fn misconfigured<St>(
    shared: &Shared<St>,
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
        &shared.settings,
        reply,
        &Rejection::Misconfigured { rule },
        true,
    )
}

fn store_failed<St: Store>(shared: &Shared<St>, reply: Reply, error: StoreError) -> Outcome<St> {
    count(shared, "store_error", None);
    let fail = shared.settings.fail;
    tracing::warn!(target: "tower_throttle", %error, fail_mode = ?fail, "rate-limit store failed");
    match fail {
        FailMode::Open => Outcome::Forward {
            info: None,
            permits: None,
            charge: None,
        },
        FailMode::Closed => Outcome::Reject(respond(
            &shared.settings,
            reply,
            &Rejection::Unavailable(&error),
            false,
        )),
    }
}

fn log_decisions<St>(shared: &Shared<St>, plan: &Plan, info: &RateLimitInfo) {
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

/// Counts a request's outcome (feature `metrics`), labelled with the
/// layer's prefix (empty when none) and the rule that decided it: the one
/// that denied or found no key, or every rule's name joined with `+` when
/// the request as a whole was admitted or the store failed. Labels come
/// from configuration only, never from requests: the series are bounded by
/// outcomes × layers × rules.
#[inline]
fn count<St>(shared: &Shared<St>, outcome: &'static str, rule: Option<usize>) {
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
