//! One rule at a time: a check (a hot GCRA cell, the shard's read lock, or
//! the write lock for a key not held yet), and the refunds, releases and
//! resets of one key.

use std::sync::atomic::Ordering;

use super::hot;
use super::slot::Slot;
use super::{read, write, MemoryStore};
use crate::algorithm::gcra;
use crate::clock::Clock;
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, StoreError};

impl<C: Clock> MemoryStore<C> {
    /// Decides one rule now, synchronously. [`Store::check`](crate::store::Store::check) calls this.
    pub fn check_sync(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(rule.key);
        let mut promote = false;
        if let Algorithm::Gcra(p) = rule.policy.algorithm() {
            match hot::check(self.inner.id, hash, p, now, rule.cost) {
                hot::Lookup::Hit(tat) => {
                    let mut d = gcra::check(p, tat, now, rule.cost);
                    d.stamp(now, rule.cost);
                    self.note_hottest(&rule, !d.allowed, now);
                    return Ok(d);
                }
                hot::Lookup::Miss { promote: run } => promote = run,
            }
        }
        self.check_in_map(rule, now, hash, index, promote)
    }

    /// [`check_sync`](Self::check_sync) of a key not on this thread's hot
    /// cell: through its shard. Apart, so the hot cell's path keeps a
    /// small frame and writes its decision where the caller reads it.
    #[inline]
    fn check_in_map(
        &self,
        rule: Charge<'_>,
        now: u64,
        hash: u64,
        index: usize,
        promote: bool,
    ) -> Result<Decision, StoreError> {
        let mut answer = self.decide_in_map(rule, now, hash, index, promote);
        if let Ok(d) = &mut answer {
            d.stamp(now, rule.cost);
            self.note_hottest(&rule, !d.allowed, now);
        }
        answer
    }

    /// [`check_in_map`](Self::check_in_map) without the receipt.
    #[inline]
    fn decide_in_map(
        &self,
        rule: Charge<'_>,
        now: u64,
        hash: u64,
        index: usize,
        promote: bool,
    ) -> Result<Decision, StoreError> {
        let shard = self.shard(index);
        let permit = rule.policy.is_concurrency().then(|| self.next_permit());
        let found = read(shard)
            .slots
            .get(&hash)
            .and_then(|slot| slot.check(rule.policy, now, rule.cost, permit));
        if let Some(d) = found {
            // The read lock is released: promoting takes the write lock.
            if promote {
                self.promote(index, hash);
            }
            return Ok(d);
        }
        self.check_absent(rule, now, hash, index, permit)
    }

    /// [`check_sync`](Self::check_sync) of a key absent from its shard, or
    /// held there for another algorithm: decides on a fresh state and
    /// inserts only what an admission changes (its namespace set on
    /// insertion).
    #[inline(never)]
    pub(super) fn check_absent(
        &self,
        rule: Charge<'_>,
        now: u64,
        hash: u64,
        index: usize,
        permit: Option<PermitId>,
    ) -> Result<Decision, StoreError> {
        let shard = self.shard(index);
        let (mut fresh, decision) = Slot::decide_fresh(rule.policy, now, rule.cost, permit, true);
        let mut shard = write(shard);
        if let Some(slot) = shard.slots.get(&hash) {
            // Inserted meanwhile by another caller.
            if let Some(d) = slot.check(rule.policy, now, rule.cost, permit) {
                return Ok(d);
            }
        }
        if decision.allowed && rule.cost > 0 {
            let ns = self.space_of(&rule);
            if !shard.slots.contains_key(&hash)
                && !self.make_room(&mut shard, now, ns, rule.policy, &[])
            {
                drop(shard);
                if rule.penalty {
                    return Err(self.penalty_room_full());
                }
                let bucket = self.inner.overflow.bucket_of(hash);
                return self.check_overflow(ns, bucket, rule, now, permit);
            }
            fresh.set_ns(ns);
            shard.next_expiry = shard.next_expiry.min(fresh.expires_at());
            // Replacing another algorithm's slot drops (and retires) it.
            shard.slots.insert(hash, fresh);
        }
        Ok(decision)
    }

    /// Gives this thread a hot cell for a GCRA key it keeps checking.
    #[cold]
    pub(super) fn promote(&self, index: usize, hash: u64) {
        let cell = write(self.shard(index))
            .slots
            .get_mut(&hash)
            .and_then(Slot::promote);
        if let Some(cell) = cell {
            hot::cache(self.inner.id, hash, cell);
        }
    }

    /// Gives a charge's units back to `key`, into the slot its receipt
    /// names (see [`Receipt`]). A charge decided on a shared counter (the
    /// store was full) is not given back: the error keeps the limit.
    pub fn refund_sync(&self, key: &[u8], policy: &Policy, receipt: &Receipt) {
        self.update(key, policy, |slot, now| slot.refund(policy, now, receipt));
    }

    /// Releases a concurrency permit.
    pub fn release_sync(&self, key: &[u8], policy: &Policy, permit: PermitId) {
        self.update(key, policy, |slot, _| slot.release(policy, permit));
        self.release_overflow(key, policy, permit);
    }

    /// Forgets `key`.
    pub fn reset_sync(&self, key: &[u8]) {
        let (hash, index) = self.locate(key);
        if let Some(slot) = write(self.shard(index)).slots.remove(&hash) {
            let space = &self.inner.spaces[slot.ns() as usize];
            space.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Runs `f` on `key`'s slot under its shard's write lock, if the slot
    /// holds `policy`'s state.
    fn update(&self, key: &[u8], policy: &Policy, f: impl FnOnce(&mut Slot, u64)) {
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(key);
        let mut shard = write(self.shard(index));
        if let Some(slot) = shard.slots.get_mut(&hash) {
            if slot.matches(policy) {
                f(slot, now);
                let at = slot.expires_at();
                shard.next_expiry = shard.next_expiry.min(at);
            }
        }
    }
}
