//! The [`Store`] impl of [`LeasingStore`]: a check served from the key's
//! lease, or a block taken, or the inner store asked as it is.

use super::grant::PutBack;
use super::plan::Plan;
use super::LeasingStore;
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::store::{Charge, Namespaces, RuleSpec, Store, StoreError};

/// How many blocks in flight one check waits for before it asks the
/// inner store itself.
const MAX_BLOCK_WAITS: u32 = 4;

impl<S: Store> Store for LeasingStore<S> {
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        // Waits for a block in flight a few times at most: each landing
        // leaves units, or a denial the next block's size learns from.
        for waits_left in (0..MAX_BLOCK_WAITS).rev() {
            let now = self.shared.clock.now_ns();
            let mut give_back = Vec::new();
            let mut prefetch = None;
            let wait = waits_left > 0;
            let plan = (self.shared).plan(&rule, now, true, wait, &mut give_back, &mut prefetch);
            if let Some(k) = prefetch {
                self.prefetch(&rule, k);
            }
            self.settle(give_back).await;
            match plan {
                Plan::Served(d, _) => return Ok(d),
                Plan::Ordinary => return self.ordinary(rule).await,
                Plan::Block(k) => return self.take_block(rule, k, now).await,
                Plan::AwaitBlock => {
                    let landed = self.shared.block_landed.notified();
                    let mut landed = std::pin::pin!(landed);
                    // Registered before looking again: a landing between
                    // the plan and the wait still wakes this check.
                    landed.as_mut().enable();
                    if self.shared.acquiring(&rule) {
                        landed.await;
                    }
                }
            }
        }
        self.ordinary(rule).await
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
            match table.get_mut(key).filter(|s| s.policy == *policy) {
                None => PutBack::NotOurs,
                Some(state) => {
                    let put = state.put_back(now, receipt);
                    match (put, state.retired.as_mut()) {
                        // A unit of the GCRA lease before: absorbed there.
                        (PutBack::NotOurs, Some(old)) => match old.put_back(now, receipt) {
                            PutBack::NotOurs => PutBack::NotOurs,
                            _ => PutBack::Passed { forward: false },
                        },
                        (put, _) => put,
                    }
                }
            }
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
                    // back what an ended lease held and takes up the next.
                    let at = lease.take(now, rule.cost)?;
                    let mut d = lease.served(now, rule.cost, at, true);
                    state.latest_remaining(&mut d, now);
                    state.note_check(now);
                    let prefetch = if self
                        .shared
                        .closed
                        .load(std::sync::atomic::Ordering::Relaxed)
                    {
                        None
                    } else {
                        state.prefetch_due(&self.shared.tuning, now, rule.cost)
                    };
                    drop(table);
                    if let Some(k) = prefetch {
                        self.prefetch(&rule, k);
                    }
                    return Some(Ok(d));
                }
                // A prefetched block to take up, or a block to ask for:
                // the asynchronous path.
                if state.next.is_some()
                    || state.block_size(&self.shared.tuning, rule.cost).is_some()
                {
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
        if matches!(&answer, Ok(d) if d.decided_by == DecidedBy::Fallback) {
            table.drop_all();
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
