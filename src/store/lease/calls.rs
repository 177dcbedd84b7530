//! The inner store's calls of a [`LeasingStore`]: ordinary checks, blocks,
//! and all-or-nothing rounds that mix served, ordinary and block charges.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::plan::Plan;
use super::table::GiveBack;
use super::{give_back_all, LeasingShared, LeasingStore};
use crate::decision::Decision;
use crate::store::{Charge, Store, StoreError};

/// Clears the `acquiring` mark of keys whose block is being asked for if
/// the check is dropped meanwhile (a caller's timeout), so they may lease
/// again. Disarmed once the inner store has answered: every answer clears
/// the marks itself.
struct Acquiring<'a, S: Store> {
    shared: &'a LeasingShared<S>,
    keys: Vec<&'a [u8]>,
}

impl<S: Store> Acquiring<'_, S> {
    fn disarm(mut self) {
        self.keys.clear();
    }
}

impl<S: Store> Drop for Acquiring<'_, S> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut table = self.shared.lock();
        for key in &self.keys {
            if let Some(state) = table.get_mut(key) {
                state.acquiring = false;
            }
        }
        drop(table);
        self.shared.landed();
    }
}

/// A prefetch in flight (see [`LeasingStore::prefetch`]): counted while
/// it lives; dropped before the block's answer (its task dropped, or the
/// store shut down before it ran), it clears the key's `acquiring` mark.
/// Either way it wakes the checks and a `shutdown` waiting for blocks.
pub(super) struct Prefetching<S: Store> {
    shared: Arc<LeasingShared<S>>,
    key: Vec<u8>,
    /// Until the inner store answers: the answer's handling clears the
    /// mark itself (and a later block may have set it again since).
    armed: bool,
}

impl<S: Store> Prefetching<S> {
    fn new(shared: Arc<LeasingShared<S>>, key: &[u8]) -> Self {
        shared.prefetching.fetch_add(1, Ordering::SeqCst);
        Prefetching {
            shared,
            key: key.to_vec(),
            armed: true,
        }
    }
}

impl<S: Store> Drop for Prefetching<S> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(state) = self.shared.lock().get_mut(&self.key) {
                state.acquiring = false;
            }
        }
        self.shared.prefetching.fetch_sub(1, Ordering::SeqCst);
        self.shared.landed();
    }
}

impl<S: Store> LeasingStore<S> {
    /// Gives back what ended leases held; a failure ends the leases.
    pub(super) async fn settle(&self, give_back: Vec<GiveBack>) {
        if give_back.is_empty() {
            return;
        }
        if let Err(e) = give_back_all(&*self.shared.inner, give_back).await {
            self.shared.failed(&e, &[]);
        }
    }

    pub(super) async fn ordinary(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        match self.shared.inner.check(rule).await {
            Ok(d) => {
                self.shared.saw(&rule, &d);
                Ok(d)
            }
            Err(e) => {
                self.shared.failed(&e, &[]);
                Err(e)
            }
        }
    }

    pub(super) async fn take_block(
        &self,
        rule: Charge<'_>,
        k: u64,
        taken_at: u64,
    ) -> Result<Decision, StoreError> {
        let block = Charge { cost: k, ..rule };
        let guard = Acquiring {
            shared: &self.shared,
            keys: vec![rule.key],
        };
        let answer = self.shared.inner.check(block).await;
        guard.disarm();
        match answer {
            Err(e) => {
                self.shared.failed(&e, &[&rule]);
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

    /// Asks for `rule`'s next block of `k` units in the background, on the
    /// current Tokio runtime. Without one, the key is no longer marked as
    /// acquiring: it takes its next block when the lease runs out.
    pub(super) fn prefetch(&self, rule: &Charge<'_>, k: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.shared.failed_block_quietly(rule);
            return;
        };
        // Owned by the task from now on: whether it runs to its end, fails,
        // or is dropped unpolled (its runtime shut down), the key is no
        // longer acquiring afterwards, and `shutdown` stops waiting for it.
        let mut in_flight = Prefetching::new(self.shared.clone(), rule.key);
        let store = self.clone();
        let policy = *rule.policy;
        runtime.spawn(async move {
            let key = in_flight.key.clone();
            let block = Charge {
                cost: k,
                ..Charge::new(&key, &policy, k)
            };
            store.take_next(block, &mut in_flight).await;
        });
    }

    /// Charges a prefetched `block` on the inner store (unless the store was
    /// shut down meanwhile) and keeps it as the key's next lease.
    async fn take_next(&self, block: Charge<'_>, in_flight: &mut Prefetching<S>) {
        if self.shared.closed.load(Ordering::SeqCst) {
            return;
        }
        let taken_at = self.shared.clock.now_ns();
        let answer = self.shared.inner.check(block).await;
        in_flight.armed = false;
        match answer {
            Err(e) => self.shared.failed(&e, &[&block]),
            Ok(d) if d.allowed => {
                let mut give_back = Vec::new();
                self.shared.keep_next(&block, taken_at, d, &mut give_back);
                self.settle(give_back).await;
            }
            Ok(d) => {
                // A fallback's answer ends every lease, as any other.
                self.shared.saw(&block, &d);
                self.shared.block_denied(&block, d.remaining);
            }
        }
    }

    /// One all-or-nothing round; `Ok(None)` when a block was denied while
    /// the others passed, to try again without blocks.
    pub(super) async fn check_all_round(
        &self,
        rules: &[Charge<'_>],
        allow_block: bool,
    ) -> Result<Option<Vec<Decision>>, StoreError> {
        let now = self.shared.clock.now_ns();
        let mut give_back = Vec::new();
        let plans: Vec<Plan> = rules
            .iter()
            .map(|r| {
                let mut prefetch = None;
                let plan =
                    (self.shared).plan(r, now, allow_block, false, &mut give_back, &mut prefetch);
                if let Some(k) = prefetch {
                    self.prefetch(r, k);
                }
                plan
            })
            .collect();
        self.settle(give_back).await;
        let answers = self.send_round(rules, &plans, now).await?;
        let mut give_back = Vec::new();
        let (out, block_denied) = self.merge_round(rules, plans, answers, now, &mut give_back);
        self.settle(give_back).await;
        if out.len() != rules.len() {
            return Err(StoreError::Protocol(
                "check_all answered with another number of decisions".into(),
            ));
        }
        if block_denied {
            // A block larger than the room: ask again with the checks' own
            // costs (nothing was charged by this round).
            return Ok(None);
        }
        Ok(Some(out))
    }

    /// The inner store's answers for the round's charges that leases do
    /// not serve (a block's charge is the block); one per charge sent.
    async fn send_round(
        &self,
        rules: &[Charge<'_>],
        plans: &[Plan],
        now: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        let charges: Vec<Charge<'_>> = rules
            .iter()
            .zip(plans)
            .filter_map(|(r, p)| match p {
                Plan::Served(..) => None,
                Plan::Ordinary | Plan::AwaitBlock => Some(*r),
                Plan::Block(k) => Some(Charge { cost: *k, ..*r }),
            })
            .collect();
        if charges.is_empty() {
            return Ok(Vec::new());
        }
        let blocks: Vec<&Charge<'_>> = rules
            .iter()
            .zip(plans)
            .filter(|(_, p)| matches!(p, Plan::Block(_)))
            .map(|(r, _)| r)
            .collect();
        let guard = Acquiring {
            shared: &self.shared,
            keys: blocks.iter().map(|r| r.key).collect(),
        };
        let answer = self.shared.inner.check_all(&charges).await;
        guard.disarm();
        let answer = answer.and_then(|ds| {
            if ds.len() == charges.len() {
                Ok(ds)
            } else {
                Err(StoreError::Protocol(
                    "check_all answered with another number of decisions".into(),
                ))
            }
        });
        answer.inspect_err(|e| {
            self.unspend_all(rules, plans, now);
            self.shared.failed(e, &blocks);
        })
    }

    /// Every rule's decision from its plan and the inner store's answers;
    /// and whether a block was denied while the others passed.
    fn merge_round(
        &self,
        rules: &[Charge<'_>],
        plans: Vec<Plan>,
        answers: Vec<Decision>,
        now: u64,
        give_back: &mut Vec<GiveBack>,
    ) -> (Vec<Decision>, bool) {
        let pass = answers.iter().all(|d| d.allowed);
        let mut answers = answers.into_iter();
        let mut out = Vec::with_capacity(rules.len());
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
                // One answer per charge sent, checked by `send_round`.
                Plan::Ordinary | Plan::AwaitBlock => {
                    let Some(d) = answers.next() else { break };
                    self.shared.saw(rule, &d);
                    d
                }
                Plan::Block(k) => {
                    let Some(d) = answers.next() else { break };
                    if pass {
                        self.shared.keep_block(rule, k, now, d, give_back)
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
        (out, block_denied)
    }

    fn unspend_all(&self, rules: &[Charge<'_>], plans: &[Plan], now: u64) {
        for (rule, plan) in rules.iter().zip(plans) {
            if let Plan::Served(_, at) = plan {
                self.shared.unspend(rule, now, *at);
            }
        }
    }
}
