//! How a [`LeasingStore`](super::LeasingStore) decides one charge: from
//! the key's lease, with a block, or as it is; and what it learns from the
//! inner store's answers.

use std::sync::atomic::Ordering;

use super::grant::Lease;
use super::table::{GiveBack, Serve, Table};
use super::LeasingShared;
use crate::decision::{DecidedBy, Decision, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, Store, StoreError};

/// How one charge is decided.
pub(super) enum Plan {
    /// From the key's lease: the decision, and the served receipt's
    /// instant (to put the units back if an all-or-nothing check denies).
    Served(Decision, u64),
    /// By the inner store as it is.
    Ordinary,
    /// By the inner store, charging a block of this many units.
    Block(u64),
    /// After the key's block in flight lands (only when asked to wait).
    AwaitBlock,
}

impl<S: Store> LeasingShared<S> {
    /// Whether this charge may ever be served from a lease.
    pub(super) fn leaseable(&self, rule: &Charge<'_>) -> bool {
        if rule.penalty || rule.cost == 0 {
            return false;
        }
        match rule.policy.algorithm() {
            Algorithm::FixedWindow(_) | Algorithm::SlidingWindow(_) => true,
            // A reservation (delay mode, `Limiter::wait`) stretches τ past
            // limit·T: its slots lie ahead by design, and each waiter's
            // budget makes another policy. Those go to the store as they are.
            Algorithm::Gcra(p) => {
                self.tuning.lease_gcra
                    && self.inner.reserves_slots()
                    && p.emission_interval_ns.checked_mul(p.limit) == Some(p.tolerance_ns)
            }
            _ => false,
        }
    }

    /// Decides how `rule` is checked at `now`, spending from its lease when
    /// it covers the charge. Leases that ended leave their units in
    /// `give_back`; a block to ask for in the background is set in
    /// `prefetch` (see [`KeyState::prefetch_due`]).
    pub(super) fn plan(
        &self,
        rule: &Charge<'_>,
        now: u64,
        allow_block: bool,
        wait: bool,
        give_back: &mut Vec<GiveBack>,
        prefetch: &mut Option<u64>,
    ) -> Plan {
        if !self.leaseable(rule) {
            return Plan::Ordinary;
        }
        let mut table = self.lock();
        let Some(state) = table.entry(rule.key, rule.policy, &self.tuning, now, give_back) else {
            return Plan::Ordinary;
        };
        state.note_check(now);
        match state.serve(rule.key, rule.cost, &self.tuning, now, give_back) {
            Serve::Served(d, at) => {
                if allow_block && !self.closed.load(Ordering::Relaxed) {
                    *prefetch = state.prefetch_due(&self.tuning, now, rule.cost);
                }
                return Plan::Served(d, at);
            }
            Serve::Short => return Plan::Ordinary,
            Serve::Nothing => {}
        }
        if !allow_block || self.closed.load(Ordering::Relaxed) {
            return Plan::Ordinary;
        }
        if state.acquiring {
            // One round trip for the block, not one per check meanwhile.
            return if wait {
                Plan::AwaitBlock
            } else {
                Plan::Ordinary
            };
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
    pub(super) fn saw(&self, rule: &Charge<'_>, d: &Decision) {
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

    /// The inner store answered `error`: when it is unavailable, its
    /// leases end with it (an error of one request, a malformed key, ends
    /// none). Either way the blocks asked for are no longer in flight.
    pub(super) fn failed(&self, error: &StoreError, blocks: &[&Charge<'_>]) {
        let mut table = self.lock();
        if error.is_unavailable() {
            table.drop_all();
        }
        for rule in blocks {
            if let Some(state) = table.get_mut(rule.key) {
                state.acquiring = false;
            }
        }
        drop(table);
        self.landed();
    }

    /// Wakes the checks waiting for a block (see `LeasingShared::block_landed`).
    pub(super) fn landed(&self) {
        self.block_landed.notify_waiters();
    }

    /// Whether `rule`'s key still has a block in flight.
    pub(super) fn acquiring(&self, rule: &Charge<'_>) -> bool {
        self.lock().get_mut(rule.key).is_some_and(|s| s.acquiring)
    }

    /// The lease of a block of `k` units of `policy` asked for at local
    /// `taken_at` and admitted as `d`, if it may be leased: not when the
    /// fallback decided it (every lease then ends: the primary failed), nor
    /// after shutdown (a block in flight then), nor when its decision
    /// cannot place its units in their slots.
    fn landed_lease(
        &self,
        table: &mut Table,
        policy: &Policy,
        d: &Decision,
        k: u64,
        taken_at: u64,
    ) -> Option<Lease> {
        if d.decided_by == DecidedBy::Fallback {
            table.drop_all();
            return None;
        }
        if self.closed.load(Ordering::Relaxed) {
            return None;
        }
        Lease::from_block(policy, d, k, taken_at, self.tuning.margin_ns)
    }

    /// The block of `k` units for `rule`, asked for at local `taken_at`,
    /// was admitted as `d`: keeps it as the key's lease and serves the
    /// check from it. A block that cannot be leased (decided by the
    /// fallback, not placeable in its slots, or after shutdown) is the
    /// check's admission;
    /// its extra units go back where the algorithm allows.
    pub(super) fn keep_block(
        &self,
        rule: &Charge<'_>,
        k: u64,
        taken_at: u64,
        d: Decision,
        give_back: &mut Vec<GiveBack>,
    ) -> Decision {
        let fallback = d.decided_by == DecidedBy::Fallback;
        let mut table = self.lock();
        let lease = self.landed_lease(&mut table, rule.policy, &d, k, taken_at);
        if let Some(state) = table.get_mut(rule.key) {
            state.acquiring = false;
            self.landed();
            if state.policy == *rule.policy {
                state.saw_remaining(d.remaining);
                if let Some(mut lease) = lease {
                    if let Some(at) = lease.take_first(rule.cost) {
                        let served = lease.served(taken_at, rule.cost, at, true);
                        // One lease per key (`acquiring`); a lease taken
                        // meanwhile by decide_now's path cannot exist, but
                        // its units would go back all the same.
                        state.end_lease(rule.key, &self.tuning, taken_at, give_back);
                        state.lease = Some(lease);
                        return served;
                    }
                }
            }
        }
        let present = table
            .get_mut(rule.key)
            .is_some_and(|s| s.policy == *rule.policy);
        drop(table);
        // Not leased: the request keeps its own cost of the block, and the
        // rest goes back (GCRA: only to a fallback, which no other process
        // shares; see the module docs) — unless the key was reset or took
        // another policy meanwhile: the reset may have cleared the charge,
        // and a refund would then take units from the admissions after it.
        let extra = k - rule.cost;
        let gcra = matches!(rule.policy.algorithm(), Algorithm::Gcra(_));
        if let (Some(r), true) = (d.receipt(), present && (fallback || !gcra)) {
            give_back.push((rule.key.to_vec(), *rule.policy, r.part(extra)));
        }
        Decision {
            charged: rule.cost,
            remaining: d.remaining.saturating_add(extra).min(d.limit),
            ..d
        }
    }

    /// The block of `k` units prefetched for `rule` (a charge of `k`),
    /// asked for at local `taken_at`, was admitted as `d`: kept as the
    /// key's next lease. A block that cannot be leased (decided by the
    /// fallback, not placeable in its slots, after shutdown) goes back
    /// where the algorithm allows; one whose key was reset or took another
    /// policy meanwhile is left as charged.
    pub(super) fn keep_next(
        &self,
        rule: &Charge<'_>,
        taken_at: u64,
        d: Decision,
        give_back: &mut Vec<GiveBack>,
    ) {
        let fallback = d.decided_by == DecidedBy::Fallback;
        let mut table = self.lock();
        let lease = self.landed_lease(&mut table, rule.policy, &d, rule.cost, taken_at);
        let (mut kept, mut present) = (false, false);
        if let Some(state) = table.get_mut(rule.key) {
            state.acquiring = false;
            if state.policy == *rule.policy {
                present = true;
                state.saw_remaining(d.remaining);
                let drain = std::mem::take(&mut state.drain);
                let lease = match lease {
                    // The leases ended short of a charge meanwhile: a
                    // window block goes back, a GCRA one is spent here.
                    Some(mut next) if drain => {
                        let gcra = matches!(rule.policy.algorithm(), Algorithm::Gcra(_));
                        gcra.then(|| {
                            super::table::spend_all(&mut next, taken_at);
                            next
                        })
                    }
                    lease => lease,
                };
                if let Some(next) = lease {
                    // One block in flight per key, so no next lease is
                    // held; one would go back all the same.
                    if let Some(mut old) = state.next.replace(next) {
                        give_back.extend(
                            old.give_back(taken_at)
                                .map(|r| (rule.key.to_vec(), old.policy, r)),
                        );
                    }
                    kept = true;
                }
            }
        }
        drop(table);
        self.landed();
        if kept || !present {
            // Kept; or the key was reset or took another policy meanwhile
            // (see `keep_block`): nothing goes back.
            return;
        }
        // Not leased: the block goes back (GCRA: only to a fallback, which
        // no other process shares; see the module docs).
        let gcra = matches!(rule.policy.algorithm(), Algorithm::Gcra(_));
        if let (Some(r), true) = (d.receipt(), fallback || !gcra) {
            give_back.push((rule.key.to_vec(), *rule.policy, r));
        }
    }

    /// A block of `rule`'s key was denied with `remaining` shared room.
    pub(super) fn block_denied(&self, rule: &Charge<'_>, remaining: u64) {
        if let Some(state) = self.lock().get_mut(rule.key) {
            state.acquiring = false;
            state.block_denied(remaining);
        }
        self.landed();
    }

    /// Puts units served at `at_ns` back into `rule`'s lease (an
    /// all-or-nothing check denied by another rule).
    pub(super) fn unspend(&self, rule: &Charge<'_>, now: u64, at_ns: u64) {
        let receipt = Receipt::new(rule.cost, at_ns, None);
        if let Some(state) = self.lock().get_mut(rule.key) {
            let _ = state.put_back(now, &receipt);
        }
    }
}

impl<S: Store> LeasingShared<S> {
    /// A block asked for in a check another rule denied: nothing was
    /// charged; the key may ask again.
    pub(super) fn failed_block_quietly(&self, rule: &Charge<'_>) {
        if let Some(state) = self.lock().get_mut(rule.key) {
            state.acquiring = false;
        }
        self.landed();
    }
}
