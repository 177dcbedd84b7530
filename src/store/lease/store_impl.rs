//! The [`Store`] impl of [`LeasingStore`]: a check served from the key's
//! lease, or a block taken, or the inner store asked as it is.

use std::future::Future;

use super::grant::PutBack;
use super::plan::Plan;
use super::table::KeyState;
use super::LeasingStore;
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::store::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};

/// How many blocks in flight one check waits for before it asks the
/// inner store itself.
const MAX_BLOCK_WAITS: u32 = 4;

impl<S: Store> LeasingStore<S> {
    /// A check of one rule through the futures: from the lease, or a block
    /// taken, or the inner store asked as it is.
    async fn check_one(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
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

    /// A check of several rules, through the futures.
    async fn check_many(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
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

    /// A check of one rule in process, when the lease in hand serves it or
    /// (for a key too cold to lease) the inner store answers at once; `None`
    /// (nothing charged) sends it to [`check_one`](Self::check_one).
    fn decide_now(&self, rule: Charge<'_>) -> Option<Result<Decision, StoreError>> {
        if !self.shared.leaseable(&rule) {
            return inner_now(&self.shared.inner, rule);
        }
        let now = self.shared.clock.now_ns();
        {
            let mut table = self.shared.lock();
            let tuning = &self.shared.tuning;
            let state = match table.get_mut(rule.key) {
                // Another policy's state: the plan replaces it, giving its
                // units back.
                Some(state) if state.policy != *rule.policy => return None,
                Some(state) => Some(state),
                // A key not seen yet: what its plan would find in a fresh
                // state.
                None => {
                    let fresh = KeyState::new(rule.policy, tuning, now);
                    if fresh
                        .block_size_after_check(tuning, rule.cost, now)
                        .is_some()
                    {
                        return None;
                    }
                    None
                }
            };
            if let Some(state) = state {
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
                // A prefetched block to take up, a block in flight or a
                // block to ask for: the asynchronous path, whose plan
                // counts this check.
                if state.next.is_some()
                    || state.acquiring
                    || state
                        .block_size_after_check(tuning, rule.cost, now)
                        .is_some()
                {
                    return None;
                }
            }
        }
        // A key not leased (too cold for a block): as the inner store
        // answers (at once or not), with the check counted once, when
        // answered here.
        let answer = inner_now(&self.shared.inner, rule)?;
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
}

/// A charge whose inner answers are read in full: every answer of the
/// inner store teaches a lease its shared `remaining`.
fn read_figures<'a>(charge: &Charge<'a>) -> Charge<'a> {
    Charge {
        figures: true,
        ..*charge
    }
}

/// The inner store's decision of `rule` when it answers at once.
fn inner_now<S: Store>(inner: &S, rule: Charge<'_>) -> Option<Result<Decision, StoreError>> {
    match inner.decide(&[rule]) {
        Answer::Now(answer) => Some(answer.and_then(Decisions::into_one)),
        Answer::Later(_) => None,
    }
}

impl<S: Store> Store for LeasingStore<S> {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        let now = match charges {
            [charge] => self
                .decide_now(read_figures(charge))
                .map(|d| d.map(Decisions::one)),
            // Leaseable rules take the asynchronous path, which tracks their
            // rate.
            _ if charges.iter().any(|c| self.shared.leaseable(c)) => None,
            _ => match self.shared.inner.decide(charges) {
                Answer::Now(answer) => Some(answer),
                Answer::Later(_) => None,
            },
        };
        if let Some(answer) = now {
            return Answer::Now(answer);
        }
        Answer::later(async move {
            match charges {
                [charge] => self
                    .check_one(read_figures(charge))
                    .await
                    .map(Decisions::one),
                _ => self.check_many(charges).await.map(Decisions::from),
            }
        })
    }

    /// [`Store::decide`] of one charge, without wrapping a lease's
    /// decision in [`Decisions`] to unwrap it again.
    async fn check(&self, charge: Charge<'_>) -> Result<Decision, StoreError> {
        let charge = read_figures(&charge);
        match self.decide_now(charge) {
            Some(answer) => answer,
            None => self.check_one(charge).await,
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
