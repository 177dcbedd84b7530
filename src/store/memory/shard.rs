//! One lock shard of the memory store: its slots, its sweep schedule, and sweeping.

use std::sync::atomic::Ordering;

use super::overflow::PENALTY_NS;
use super::slot::Ns;
use super::{write, MemoryStore, Slots, MIN_SWEEP_AT};
use crate::clock::Clock;

pub(super) struct Shard {
    pub(super) slots: Slots,
    /// Sweep when `slots.len()` reaches this.
    pub(super) sweep_at: usize,
    /// No slot expires before this: sweeping earlier frees nothing.
    pub(super) next_expiry: u64,
    /// Where the next eviction's sample starts (see `MemoryStore::evict`).
    pub(super) evict_at: usize,
}

impl Shard {
    pub(super) fn new() -> Self {
        Shard {
            slots: Slots::default(),
            sweep_at: MIN_SWEEP_AT,
            next_expiry: 0,
            evict_at: 0,
        }
    }

    /// Drops every slot back at a fresh state, telling `on_free` the
    /// namespace of each; returns how many.
    pub(super) fn sweep(&mut self, now: u64, mut on_free: impl FnMut(Ns)) -> usize {
        let before = self.slots.len();
        let mut next_expiry = u64::MAX;
        self.slots.retain(|_, slot| {
            if slot.retire_if_cold(now) {
                on_free(slot.ns());
                return false;
            }
            next_expiry = next_expiry.min(slot.expires_at());
            true
        });
        self.next_expiry = next_expiry;
        let len = self.slots.len();
        if self.slots.capacity() > 4 * len.max(MIN_SWEEP_AT) {
            self.slots.shrink_to(2 * len);
        }
        // Amortised: the next growth-triggered sweep waits for the shard to double.
        self.sweep_at = (2 * len).max(MIN_SWEEP_AT);
        before - len
    }
}

impl<C: Clock> MemoryStore<C> {
    /// Drops every key that is back to a fresh state; returns how many. The
    /// janitor calls this; call it yourself only to free memory at once.
    pub fn sweep(&self) -> usize {
        let now = self.inner.clock.now_ns();
        let freed = self
            .inner
            .shards
            .iter()
            .map(|s| self.sweep_shard(&mut write(s), now))
            .sum();
        self.sweep_overflow(now);
        freed
    }

    pub(super) fn sweep_shard(&self, shard: &mut Shard, now: u64) -> usize {
        let spaces = &self.inner.spaces;
        if let [rest, penalty] = &spaces[..] {
            let mut penalties = 0;
            let freed = shard.sweep(now, |ns| penalties += usize::from(ns == PENALTY_NS));
            rest.live.fetch_sub(freed - penalties, Ordering::Relaxed);
            penalty.live.fetch_sub(penalties, Ordering::Relaxed);
            return freed;
        }
        let mut per_space = vec![0usize; spaces.len()];
        let freed = shard.sweep(now, |ns| per_space[ns as usize] += 1);
        for (space, &n) in spaces.iter().zip(&per_space) {
            if n > 0 {
                space.live.fetch_sub(n, Ordering::Relaxed);
            }
        }
        freed
    }
}
