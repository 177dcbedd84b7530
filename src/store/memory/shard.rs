//! One lock shard of the memory store: its slots and its sweep schedule.

use super::slot::Ns;
use super::{Slots, MIN_SWEEP_AT};

pub(super) struct Shard {
    pub(super) slots: Slots,
    /// Sweep when `slots.len()` reaches this.
    pub(super) sweep_at: usize,
    /// No slot expires before this: sweeping earlier frees nothing.
    pub(super) next_expiry: u64,
}

impl Shard {
    pub(super) fn new() -> Self {
        Shard {
            slots: Slots::default(),
            sweep_at: MIN_SWEEP_AT,
            next_expiry: 0,
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
