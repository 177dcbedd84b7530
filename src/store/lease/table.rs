//! Per-key state of a [`LeasingStore`](super::LeasingStore): the local
//! rate of checks, the adaptive block size, and the lease in hand, in a
//! table of bounded size.

use std::collections::HashMap;

use super::grant::{Lease, PutBack};
use crate::decision::{Decision, Receipt};
use crate::policy::{Algorithm, Policy};

/// The tuning a [`LeasingStoreBuilder`](super::LeasingStoreBuilder) sets.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tuning {
    pub(super) hot_threshold: u64,
    pub(super) initial_block: u64,
    pub(super) max_block: u64,
    pub(super) blocks_per_period: u64,
    pub(super) max_keys: usize,
    pub(super) lease_gcra: bool,
    pub(super) margin_ns: u64,
    pub(super) prefetch: bool,
}

/// One tracked key.
#[derive(Debug)]
pub(super) struct KeyState {
    pub(super) policy: Policy,
    /// Rate measured in checks per period (τ for GCRA, the window for
    /// windows): the count of this period and of the one before.
    period_ns: u64,
    period: u64,
    /// Where `period` ends: a check before it is counted without a division.
    period_end: u64,
    current: u64,
    previous: u64,
    last_seen: u64,
    /// The next block's size before the caps of [`KeyState::block_size`].
    block: u64,
    /// The shared `remaining` of the key's latest decision from the inner
    /// store (a block's counts the block as spent).
    last_remaining: Option<u64>,
    /// A block is being asked for (one at a time per key): checks that
    /// meanwhile find no units wait for it or go to the inner store as
    /// they are, so one process holds at most a lease and a prefetched
    /// block of a key.
    pub(super) acquiring: bool,
    pub(super) lease: Option<Lease>,
    /// The block taken while `lease` still held units (prefetched): spent
    /// once `lease` can serve no more.
    pub(super) next: Option<Lease>,
    /// GCRA: the lease before `lease`, whose spent units may still be
    /// refunded: such a refund is absorbed here, never sent to the inner
    /// store (see the module docs, *Why GCRA units are not given back*).
    pub(super) retired: Option<Lease>,
    /// The leases ended short of a charge while a block was in flight:
    /// that block is not leased when it lands (see [`KeyState::short`]).
    pub(super) drain: bool,
}

impl KeyState {
    pub(super) fn new(policy: &Policy, tuning: &Tuning, now: u64) -> Self {
        let period_ns = match *policy.algorithm() {
            Algorithm::Gcra(p) => p.tolerance_ns,
            Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) => p.window_ns,
            _ => u64::MAX,
        }
        .max(1);
        KeyState {
            policy: *policy,
            period_ns,
            period: now / period_ns,
            period_end: (now / period_ns)
                .saturating_add(1)
                .saturating_mul(period_ns),
            current: 0,
            previous: 0,
            last_seen: now,
            block: tuning.initial_block,
            last_remaining: None,
            acquiring: false,
            lease: None,
            next: None,
            retired: None,
            drain: false,
        }
    }

    /// Counts one check at `now`.
    pub(super) fn note_check(&mut self, now: u64) {
        if now >= self.period_end {
            let period = now / self.period_ns;
            (self.previous, self.current) = self.counts_at(now);
            self.period = period;
            self.period_end = period.saturating_add(1).saturating_mul(self.period_ns);
        }
        self.current += 1;
        self.last_seen = self.last_seen.max(now);
    }

    /// The last period's and this one's checks as seen at `now`, before a
    /// check then is counted.
    fn counts_at(&self, now: u64) -> (u64, u64) {
        if now < self.period_end {
            return (self.previous, self.current);
        }
        let next = self.period.saturating_add(1);
        match now / self.period_ns == next {
            true => (self.current, 0),
            false => (0, 0),
        }
    }

    /// Records the shared `remaining` the inner store reported.
    pub(super) fn saw_remaining(&mut self, remaining: u64) {
        self.last_remaining = Some(remaining);
    }

    /// The size of a block to lease for a check of `cost`, or `None` when
    /// the key is cold or a block would be no larger than the check.
    pub(super) fn block_size(&self, tuning: &Tuning, cost: u64) -> Option<u64> {
        self.block_size_with(tuning, cost, self.previous, self.current)
    }

    /// [`block_size`](Self::block_size) once a check at `now` is counted,
    /// counting nothing: what the plan of that check will find.
    pub(super) fn block_size_after_check(
        &self,
        tuning: &Tuning,
        cost: u64,
        now: u64,
    ) -> Option<u64> {
        let (previous, current) = self.counts_at(now);
        self.block_size_with(tuning, cost, previous, current + 1)
    }

    fn block_size_with(
        &self,
        tuning: &Tuning,
        cost: u64,
        previous: u64,
        current: u64,
    ) -> Option<u64> {
        // Local checks per period: the last full period's, or this one's
        // once it has more (a key that just turned hot).
        let rate = previous.max(current);
        if rate < tuning.hot_threshold {
            return None;
        }
        if matches!(self.policy.algorithm(), Algorithm::Gcra(_)) && cost != 1 {
            return None;
        }
        // Sized by the last full period's rate once there is one; in the
        // period a key turns hot, by the adaptive size alone.
        let by_rate = if previous > 0 {
            (rate / tuning.blocks_per_period).max(1)
        } else {
            u64::MAX
        };
        // Never below the smallest block that leases a unit beyond the
        // check's own: a target halved down to the cost would take no lease
        // again, and only a lease's end lets it grow (a process stuck on
        // one Redis call per check after a burst of wasted blocks).
        let mut k = self
            .block
            .max(cost.saturating_add(1))
            .min(tuning.max_block)
            .min(by_rate)
            .min(self.policy.limit());
        if let Some(remaining) = self.last_remaining {
            // A block larger than the shared room would be denied (the
            // room reported after the key's last decision).
            k = k.min(remaining);
        }
        (k > cost).then_some(k)
    }

    /// Adapts the block size to how the lease that just ended went: units
    /// that expired unspent halve it, a lease spent in full doubles it.
    pub(super) fn lease_ended(&mut self, lease: &Lease, tuning: &Tuning) {
        self.block = if lease.wasted() > 0 {
            (self.block / 2).max(1)
        } else {
            self.block.saturating_mul(2).min(tuning.max_block)
        };
    }

    /// A block of this size was denied: the shared room is smaller.
    pub(super) fn block_denied(&mut self, remaining: u64) {
        self.block = (self.block / 2).max(1);
        self.last_remaining = Some(remaining);
    }

    /// Ends the lease in hand (if any): adapts the block size, keeps a GCRA
    /// lease as `retired`, and pushes what a window lease still holds to
    /// `give_back`.
    pub(super) fn end_lease(
        &mut self,
        key: &[u8],
        tuning: &Tuning,
        now: u64,
        give_back: &mut Vec<GiveBack>,
    ) {
        let Some(mut ended) = self.lease.take() else {
            return;
        };
        self.lease_ended(&ended, tuning);
        match ended.give_back(now) {
            Some(r) => give_back.push((key.to_vec(), ended.policy, r)),
            None if matches!(ended.policy.algorithm(), Algorithm::Gcra(_)) => {
                self.retired = Some(ended);
            }
            None => {}
        }
    }

    /// Serves `cost` units at `now` from the lease in hand, or from the
    /// prefetched one once the lease in hand has none left (it ends, and
    /// what it held goes to `give_back`).
    pub(super) fn serve(
        &mut self,
        key: &[u8],
        cost: u64,
        tuning: &Tuning,
        now: u64,
        give_back: &mut Vec<GiveBack>,
    ) -> Serve {
        loop {
            let Some(lease) = &mut self.lease else {
                if self.next.is_none() {
                    return Serve::Nothing;
                }
                self.lease = self.next.take();
                continue;
            };
            if let Some(at) = lease.take(now, cost) {
                let mut d = lease.served(now, cost, at, true);
                self.latest_remaining(&mut d, now);
                return Serve::Served(d, at);
            }
            if lease.unspent(now) > 0 {
                // Held, but not enough for this charge (or a GCRA charge
                // of several units): the lease stays for the next checks,
                // and the prefetched block, a lease of its own, may serve.
                if let Some(next) = &mut self.next {
                    if let Some(at) = next.take(now, cost) {
                        let mut d = next.served(now, cost, at, true);
                        self.latest_remaining(&mut d, now);
                        return Serve::Served(d, at);
                    }
                }
                return self.short(key, now, give_back);
            }
            self.end_lease(key, tuning, now, give_back);
            if self.next.is_none() {
                return Serve::Nothing;
            }
        }
    }

    /// The leases are short of a charge that the inner store will decide
    /// as it is: they end first, so it decides on the whole room. A settled
    /// cost charged "as far as the quota has room" must not leave units
    /// here that admit requests after the quota was spent. Window leases
    /// give their units back; GCRA leases cannot (see the module docs) and
    /// are spent where they are, kept to absorb their refunds. A block in
    /// flight meets the same fate when it lands (`drain`).
    fn short(&mut self, key: &[u8], now: u64, give_back: &mut Vec<GiveBack>) -> Serve {
        self.drain = self.acquiring;
        if matches!(self.policy.algorithm(), Algorithm::Gcra(_)) {
            for lease in [self.lease.as_mut(), self.next.as_mut()]
                .into_iter()
                .flatten()
            {
                spend_all(lease, now);
            }
        } else {
            self.give_back_all(key, now, give_back);
        }
        Serve::Short
    }

    /// Sets `d.remaining`, of a check served at `now`, from the latest
    /// block once a prefetched one has landed: the shared remaining it
    /// reported plus every unit this process holds.
    pub(super) fn latest_remaining(&mut self, d: &mut Decision, now: u64) {
        let Some(next) = &mut self.next else {
            return;
        };
        let held = self.lease.as_mut().map_or(0, |l| l.unspent(now));
        let held = held.saturating_add(next.unspent(now));
        d.remaining = next.shared_remaining().saturating_add(held).min(d.limit);
    }

    /// Gives back into the lease that served it (the lease in hand or the
    /// prefetched one) a served receipt.
    pub(super) fn put_back(&mut self, now: u64, receipt: &Receipt) -> PutBack {
        for lease in [self.lease.as_mut(), self.next.as_mut()]
            .into_iter()
            .flatten()
        {
            match lease.put_back(now, receipt) {
                PutBack::NotOurs => {}
                put => return put,
            }
        }
        PutBack::NotOurs
    }

    /// Whether to ask for the next block now, in the background, and of
    /// what size: when the lease in hand is down to a quarter of its block
    /// (at least one unit), none is prefetched or in flight, and the key
    /// is hot enough for a block. Marks the block in flight.
    pub(super) fn prefetch_due(&mut self, tuning: &Tuning, now: u64, cost: u64) -> Option<u64> {
        if !tuning.prefetch || self.acquiring || self.next.is_some() {
            return None;
        }
        let lease = self.lease.as_mut()?;
        let left = lease.unspent(now);
        if left == 0 || left > (lease.block_units() / 4).max(1) {
            return None;
        }
        let k = self.block_size(tuning, cost)?;
        self.acquiring = true;
        Some(k)
    }

    /// Ends both leases without adapting the block size; what they hold
    /// goes to `give_back`.
    fn give_back_all(&mut self, key: &[u8], now: u64, give_back: &mut Vec<GiveBack>) {
        for mut lease in [self.lease.take(), self.next.take()].into_iter().flatten() {
            give_back.extend(
                lease
                    .give_back(now)
                    .map(|r| (key.to_vec(), lease.policy, r)),
            );
        }
    }

    /// Current block size target (for tests and diagnostics).
    pub(super) fn block(&self) -> u64 {
        self.block
    }
}

/// Marks every unit of a GCRA lease spent: they stay charged.
pub(super) fn spend_all(lease: &mut Lease, now: u64) {
    for _ in 0..lease.unspent(now) {
        if lease.take(now, 1).is_none() {
            break;
        }
    }
}

/// What [`KeyState::serve`] did.
pub(super) enum Serve {
    /// Served: the decision, and the served receipt's instant.
    Served(Decision, u64),
    /// The lease holds units, but fewer than the charge.
    Short,
    /// No lease can serve (none, or all ended).
    Nothing,
}

/// A receipt to give back to the inner store: key, policy, units.
pub(super) type GiveBack = (Vec<u8>, Policy, Receipt);

/// Tracked keys, at most `max_keys` of them.
#[derive(Debug, Default)]
pub(super) struct Table {
    /// foldhash, seeded per table: every served check hashes its key here.
    keys: HashMap<Vec<u8>, KeyState, foldhash::fast::RandomState>,
}

impl Table {
    /// The state of `key` under `policy`, tracking it if there is room.
    /// A key seen under another policy starts afresh; what its old lease
    /// still held is pushed to `give_back`. `None`: the table is full of
    /// keys seen recently, and this one is treated as cold.
    pub(super) fn entry(
        &mut self,
        key: &[u8],
        policy: &Policy,
        tuning: &Tuning,
        now: u64,
        give_back: &mut Vec<GiveBack>,
    ) -> Option<&mut KeyState> {
        if !self.keys.contains_key(key) {
            if self.keys.len() >= tuning.max_keys {
                self.sweep(now, give_back);
            }
            if self.keys.len() >= tuning.max_keys {
                return None;
            }
            self.keys
                .insert(key.to_vec(), KeyState::new(policy, tuning, now));
        }
        let state = self.keys.get_mut(key)?;
        if state.policy != *policy {
            state.give_back_all(key, now, give_back);
            *state = KeyState::new(policy, tuning, now);
        }
        Some(state)
    }

    /// The state of `key`, if tracked.
    pub(super) fn get_mut(&mut self, key: &[u8]) -> Option<&mut KeyState> {
        self.keys.get_mut(key)
    }

    /// Forgets `key` and its lease (nothing given back: a reset clears the
    /// inner store's state of it anyway).
    pub(super) fn forget(&mut self, key: &[u8]) {
        self.keys.remove(key);
    }

    /// Drops keys idle for two periods; their leases' units go back.
    fn sweep(&mut self, now: u64, give_back: &mut Vec<GiveBack>) {
        self.keys.retain(|key, s| {
            let idle = now.saturating_sub(s.last_seen) >= s.period_ns.saturating_mul(2);
            if idle && !s.acquiring {
                s.give_back_all(key, now, give_back);
                return false;
            }
            true
        });
    }

    /// Ends every lease; what they still hold goes to `give_back`.
    pub(super) fn end_all(&mut self, now: u64, give_back: &mut Vec<GiveBack>) {
        for (key, s) in &mut self.keys {
            s.give_back_all(key, now, give_back);
        }
    }

    /// Ends every lease without giving anything back (the inner store
    /// failed: its leases end with it).
    pub(super) fn drop_all(&mut self) {
        for s in self.keys.values_mut() {
            s.lease = None;
            s.next = None;
        }
    }
}
