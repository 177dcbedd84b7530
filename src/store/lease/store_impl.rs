//! The [`Store`] impl of [`LeasingStore`]: a check served from the key's
//! lease, or a block taken, or the inner store asked as it is.

use std::sync::atomic::Ordering;

use super::grant::{Lease, PutBack};
use super::table::GiveBack;
use super::{give_back_all, LeasingShared, LeasingStore};
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, Namespaces, RuleSpec, Store, StoreError};

/// How one charge is decided.
enum Plan {
    /// From the key's lease: the decision, and the served receipt's
    /// instant (to put the units back if an all-or-nothing check denies).
    Served(Decision, u64),
    /// By the inner store as it is.
    Ordinary,
    /// By the inner store, charging a block of this many units.
    Block(u64),
}

impl<S: Store> LeasingShared<S> {
    /// Whether this charge may ever be served from a lease.
    fn leaseable(&self, rule: &Charge<'_>) -> bool {
        if rule.penalty || rule.cost == 0 {
            return false;
        }
        match rule.policy.algorithm() {
            Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_) => true,
            Algorithm::Gcra(_) => self.tuning.lease_gcra && self.inner.reserves_slots(),
            _ => false,
        }
    }

    /// Decides how `rule` is checked at `now`, spending from its lease when
    /// it covers the charge. Leases that ended leave their units in
    /// `give_back`.
    fn plan(
        &self,
        rule: &Charge<'_>,
        now: u64,
        allow_block: bool,
        give_back: &mut Vec<GiveBack>,
    ) -> Plan {
        if !self.leaseable(rule) {
            return Plan::Ordinary;
        }
        let mut table = self.lock();
        let Some(state) = table.entry(rule.key, rule.policy, &self.tuning, now, give_back) else {
            return Plan::Ordinary;
        };
        state.note_check(now);
        if let Some(lease) = &mut state.lease {
            if let Some(at) = lease.take(now, rule.cost) {
                return Plan::Served(lease.served(now, rule.cost, at, true), at);
            }
            if lease.unspent(now) > 0 {
                // Held, but not enough for this charge (or a GCRA charge
                // of several units): the lease stays for the next checks.
                return Plan::Ordinary;
            }
            if let Some(mut ended) = state.lease.take() {
                state.lease_ended(&ended, &self.tuning);
                give_back.extend(
                    ended
                        .give_back(now)
                        .map(|r| (rule.key.to_vec(), ended.policy, r)),
                );
            }
        }
        if !allow_block || state.acquiring || self.closed.load(Ordering::Relaxed) {
            return Plan::Ordinary;
        }
        match state.block_size(&self.tuning, rule.cost) {
            Some(k) => {
                state.acquiring = true;
                Plan::Block(k)
            }
            None => Plan::Ordinary,
        }
    }

    /// Notes a decision the inner store made for `rule`: its shared
    /// `remaining`, and the end of every lease when the fallback decided.
    fn saw(&self, rule: &Charge<'_>, d: &Decision) {
        let mut table = self.lock();
        if d.decided_by == DecidedBy::Fallback {
            table.drop_all();
        }
        if let Some(state) = table.get_mut(rule.key) {
            if state.policy == *rule.policy {
                state.saw_remaining(d.remaining);
            }
        }
    }

    /// The inner store failed: its leases end with it.
    fn failed(&self, blocks: &[&Charge<'_>]) {
        let mut table = self.lock();
        table.drop_all();
        for rule in blocks {
            if let Some(state) = table.get_mut(rule.key) {
                state.acquiring = false;
            }
        }
    }

    /// The block of `k` units for `rule`, asked for at local `taken_at`,
    /// was admitted as `d`: keeps it as the key's lease and serves the
    /// check from it. A block that cannot be leased (decided by the
    /// fallback, or not placeable in its slots) is the check's admission;
    /// its extra units go back where the algorithm allows.
    fn keep_block(
        &self,
        rule: &Charge<'_>,
        k: u64,
        taken_at: u64,
        d: Decision,
        give_back: &mut Vec<GiveBack>,
    ) -> Decision {
        let fallback = d.decided_by == DecidedBy::Fallback;
        let mut table = self.lock();
        if fallback {
            table.drop_all();
        }
        let lease = if fallback {
            None
        } else {
            Lease::from_block(rule.policy, &d, k, taken_at)
        };
        if let Some(state) = table.get_mut(rule.key) {
            state.acquiring = false;
            if state.policy == *rule.policy {
                state.saw_remaining(d.remaining);
                if let Some(mut lease) = lease {
                    if let Some(at) = lease.take(taken_at, rule.cost) {
                        let served = lease.served(taken_at, rule.cost, at, true);
                        state.lease = Some(lease);
                        return served;
                    }
                }
            }
        }
        drop(table);
        // Not leased: the request keeps its own cost of the block, and the
        // rest goes back (GCRA: only to a fallback, which no other process
        // shares; see the module docs).
        let extra = k - rule.cost;
        let gcra = matches!(rule.policy.algorithm(), Algorithm::Gcra(_));
        if let (Some(r), true) = (d.receipt(), fallback || !gcra) {
            give_back.push((rule.key.to_vec(), *rule.policy, r.part(extra)));
        }
        Decision {
            charged: rule.cost,
            remaining: d.remaining.saturating_add(extra).min(d.limit),
            ..d
        }
    }

    /// A block of `rule`'s key was denied with `remaining` shared room.
    fn block_denied(&self, rule: &Charge<'_>, remaining: u64) {
        if let Some(state) = self.lock().get_mut(rule.key) {
            state.acquiring = false;
            state.block_denied(remaining);
        }
    }

    /// Puts units served at `at_ns` back into `rule`'s lease (an
    /// all-or-nothing check denied by another rule).
    fn unspend(&self, rule: &Charge<'_>, now: u64, at_ns: u64) {
        let receipt = Receipt::new(rule.cost, at_ns, None);
        if let Some(lease) = self.lock().get_mut(rule.key).and_then(|s| s.lease.as_mut()) {
            let _ = lease.put_back(now, &receipt);
        }
    }
}

impl<S: Store> LeasingStore<S> {
    /// Gives back what ended leases held; a failure ends the leases.
    async fn settle(&self, give_back: Vec<GiveBack>) {
        if give_back.is_empty() {
            return;
        }
        if give_back_all(&*self.shared.inner, give_back).await.is_err() {
            self.shared.failed(&[]);
        }
    }

    async fn ordinary(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        match self.shared.inner.check(rule).await {
            Ok(d) => {
                self.shared.saw(&rule, &d);
                Ok(d)
            }
            Err(e) => {
                self.shared.failed(&[]);
                Err(e)
            }
        }
    }

    async fn take_block(
        &self,
        rule: Charge<'_>,
        k: u64,
        taken_at: u64,
    ) -> Result<Decision, StoreError> {
        let block = Charge { cost: k, ..rule };
        match self.shared.inner.check(block).await {
            Err(e) => {
                self.shared.failed(&[&rule]);
                Err(e)
            }
            Ok(d) if d.allowed => {
                let mut give_back = Vec::new();
                let d = self
                    .shared
                    .keep_block(&rule, k, taken_at, d, &mut give_back);
                self.settle(give_back).await;
                Ok(d)
            }
            Ok(d) => {
                // The room is smaller than the block, not necessarily zero.
                self.shared.block_denied(&rule, d.remaining);
                self.ordinary(rule).await
            }
        }
    }

    /// One all-or-nothing round; `Ok(None)` when a block was denied while
    /// the others passed, to try again without blocks.
    async fn check_all_round(
        &self,
        rules: &[Charge<'_>],
        allow_block: bool,
    ) -> Result<Option<Vec<Decision>>, StoreError> {
        let now = self.shared.clock.now_ns();
        let mut give_back = Vec::new();
        let plans: Vec<Plan> = rules
            .iter()
            .map(|r| self.shared.plan(r, now, allow_block, &mut give_back))
            .collect();
        self.settle(give_back).await;
        let charges: Vec<Charge<'_>> = rules
            .iter()
            .zip(&plans)
            .filter_map(|(r, p)| match p {
                Plan::Served(..) => None,
                Plan::Ordinary => Some(*r),
                Plan::Block(k) => Some(Charge { cost: *k, ..*r }),
            })
            .collect();
        let blocks: Vec<&Charge<'_>> = rules
            .iter()
            .zip(&plans)
            .filter(|(_, p)| matches!(p, Plan::Block(_)))
            .map(|(r, _)| r)
            .collect();
        let answers = if charges.is_empty() {
            Vec::new()
        } else {
            match self.shared.inner.check_all(&charges).await {
                Ok(ds) if ds.len() == charges.len() => ds,
                Ok(_) => {
                    self.unspend_all(rules, &plans, now);
                    self.shared.failed(&blocks);
                    return Err(StoreError::Protocol(
                        "check_all answered with another number of decisions".into(),
                    ));
                }
                Err(e) => {
                    self.unspend_all(rules, &plans, now);
                    self.shared.failed(&blocks);
                    return Err(e);
                }
            }
        };
        let pass = answers.iter().all(|d| d.allowed);
        let mut answers = answers.into_iter();
        let mut out = Vec::with_capacity(rules.len());
        let mut give_back = Vec::new();
        let mut block_denied = false;
        for (rule, plan) in rules.iter().zip(plans) {
            let d = match plan {
                Plan::Served(d, _) if pass => d,
                Plan::Served(d, at) => {
                    // Denied by another rule: the unit goes back, and this
                    // rule reports a peek.
                    self.shared.unspend(rule, now, at);
                    Decision {
                        charged: 0,
                        charged_at_ns: 0,
                        remaining: d.remaining.saturating_add(rule.cost).min(d.limit),
                        ..d
                    }
                }
                Plan::Ordinary => {
                    let d = answers.next().unwrap_or_else(|| unreachable!());
                    self.shared.saw(rule, &d);
                    d
                }
                Plan::Block(k) => {
                    let d = answers.next().unwrap_or_else(|| unreachable!());
                    if pass {
                        self.shared.keep_block(rule, k, now, d, &mut give_back)
                    } else if !d.allowed {
                        self.shared.block_denied(rule, d.remaining);
                        block_denied = true;
                        d
                    } else {
                        // Another rule denied: a peek, nothing charged.
                        self.shared.failed_block_quietly(rule);
                        d
                    }
                }
            };
            out.push(d);
        }
        self.settle(give_back).await;
        if block_denied {
            // A block larger than the room: ask again with the checks' own
            // costs (nothing was charged by this round).
            return Ok(None);
        }
        Ok(Some(out))
    }

    fn unspend_all(&self, rules: &[Charge<'_>], plans: &[Plan], now: u64) {
        for (rule, plan) in rules.iter().zip(plans) {
            if let Plan::Served(_, at) = plan {
                self.shared.unspend(rule, now, *at);
            }
        }
    }
}

impl<S: Store> LeasingShared<S> {
    /// A block asked for in a check another rule denied: nothing was
    /// charged; the key may ask again.
    fn failed_block_quietly(&self, rule: &Charge<'_>) {
        if let Some(state) = self.lock().get_mut(rule.key) {
            state.acquiring = false;
        }
    }
}

impl<S: Store> Store for LeasingStore<S> {
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        let now = self.shared.clock.now_ns();
        let mut give_back = Vec::new();
        let plan = self.shared.plan(&rule, now, true, &mut give_back);
        self.settle(give_back).await;
        match plan {
            Plan::Served(d, _) => Ok(d),
            Plan::Ordinary => self.ordinary(rule).await,
            Plan::Block(k) => self.take_block(rule, k, now).await,
        }
    }

    async fn check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        if let [rule] = rules {
            return Ok(vec![self.check(*rule).await?]);
        }
        if let Some(out) = self.check_all_round(rules, true).await? {
            return Ok(out);
        }
        match self.check_all_round(rules, false).await? {
            Some(out) => Ok(out),
            None => Err(StoreError::Protocol(
                "a block was asked for in a check that allows none".into(),
            )),
        }
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        let now = self.shared.clock.now_ns();
        let put = {
            let mut table = self.shared.lock();
            table
                .get_mut(key)
                .filter(|s| s.policy == *policy)
                .and_then(|s| s.lease.as_mut())
                .map_or(PutBack::NotOurs, |lease| lease.put_back(now, receipt))
        };
        match put {
            PutBack::Local | PutBack::Passed { forward: false } => Ok(()),
            PutBack::Passed { forward: true } | PutBack::NotOurs => {
                self.shared.inner.refund(key, policy, receipt).await
            }
        }
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.shared.lock().forget(key);
        self.shared.inner.reset(key, policy).await
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.shared.inner.release(key, policy, permit).await
    }

    fn check_now(&self, rule: Charge<'_>) -> Option<Result<Decision, StoreError>> {
        if !self.shared.leaseable(&rule) {
            return self.shared.inner.check_now(rule);
        }
        let now = self.shared.clock.now_ns();
        {
            let mut table = self.shared.lock();
            if let Some(state) = table.get_mut(rule.key).filter(|s| s.policy == *rule.policy) {
                if let Some(lease) = state.lease.as_mut() {
                    // Served in process: the point of a lease. A lease that
                    // cannot serve takes the asynchronous path, which gives
                    // back what an ended lease held.
                    let at = lease.take(now, rule.cost)?;
                    let d = lease.served(now, rule.cost, at, true);
                    state.note_check(now);
                    return Some(Ok(d));
                }
                if state.block_size(&self.shared.tuning, rule.cost).is_some() {
                    return None;
                }
            }
        }
        // A cold key: as the inner store answers (in process or not), with
        // the check counted once, when answered here.
        let answer = self.shared.inner.check_now(rule)?;
        // Leases displaced here (a sweep of idle keys, whose windows have
        // passed) would give nothing back: their units lapse.
        let mut displaced = Vec::new();
        let mut table = self.shared.lock();
        if let Some(state) = table.entry(
            rule.key,
            rule.policy,
            &self.shared.tuning,
            now,
            &mut displaced,
        ) {
            state.note_check(now);
            if let Ok(d) = &answer {
                state.saw_remaining(d.remaining);
            }
        }
        Some(answer)
    }

    fn check_all_now(&self, rules: &[Charge<'_>]) -> Option<Result<Vec<Decision>, StoreError>> {
        // Leaseable rules take the asynchronous path, which tracks their rate.
        if rules.iter().any(|r| self.shared.leaseable(r)) {
            return None;
        }
        self.shared.inner.check_all_now(rules)
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.shared.inner.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.shared.inner.reserves_slots()
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        self.shared.inner.namespaces()
    }
}
