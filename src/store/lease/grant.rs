//! One lease: a block of units charged on the inner store in one call,
//! spent in process one check at a time, each unit only inside the slot it
//! was charged in (see the module docs of [`super`] for the proofs).

use std::time::Duration;

use crate::decision::{Decision, Receipt};
use crate::policy::{Algorithm, Policy};

/// Where the units of a lease may be spent, on the local clock.
#[derive(Clone, Debug)]
enum Slots {
    /// Fixed or sliding window: any unit until the charged window ends.
    Window {
        /// First local instant at which no unit may be spent.
        deadline: u64,
        /// Units not spent (nor expired).
        available: u64,
        /// Sliding window only: units given back after the window ended
        /// still lower the next window's weighted count, until then.
        refund_until: u64,
    },
    /// GCRA: unit `i` until its virtual slot, `first_deadline + i·T`.
    Gcra {
        first_deadline: u64,
        interval: u64,
        units: u64,
        /// Units below `next` were spent or have expired.
        next: u64,
        /// Spent units given back by a refund (indices below `next`).
        returned: Vec<u64>,
        /// Slot of unit 0 on the inner store's clock: a served receipt
        /// names its unit's slot, `slot0 + i·T`.
        slot0: u64,
    },
}

/// What a refund of a receipt does to a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PutBack {
    /// The units are back in the lease, in their own slot.
    Local,
    /// Served by this lease, but its slot has passed: nothing to give back
    /// locally. `forward`: the inner store may still take them (a sliding
    /// window's previous count).
    Passed { forward: bool },
    /// Not a receipt of this lease.
    NotOurs,
}

/// A block of units leased from the inner store.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub(super) policy: Policy,
    /// The block's receipt on the inner store (what goes back).
    pub(super) receipt: Receipt,
    /// The block's decision: the shared figures at lease time.
    block: Decision,
    /// Local instant read before the block was asked for.
    taken_at: u64,
    /// Units served and not given back.
    pub(super) spent: u64,
    /// GCRA: units whose slot passed unspent (window leases keep theirs
    /// in `available`, to give back).
    wasted: u64,
    slots: Slots,
}

impl Lease {
    /// The lease of an admitted block of `units` asked for at local
    /// `taken_at`, every deadline `margin` ns early (the store's clock
    /// granularity and rate skew). `None` when the decision cannot place the
    /// units in their slots (no receipt, figures inconsistent with the
    /// algorithm), so none is spent later than the store would allow.
    pub(super) fn from_block(
        policy: &Policy,
        block: &Decision,
        units: u64,
        taken_at: u64,
        margin: u64,
    ) -> Option<Lease> {
        let receipt = block.receipt().filter(|r| r.units() == units)?;
        let reset = u64::try_from(block.reset_after.as_nanos()).ok()?;
        let taken_at_early = taken_at.checked_sub(margin)?;
        let slots = match *policy.algorithm() {
            // An admission leaves its window counted until the window's end:
            // `reset_after` is the time left in it. When the key held a
            // later window than the charge's instant (another instance's
            // clock ran ahead, or its batch arrived first), the block counts
            // in that window, its receipt names that window's start, and
            // `reset_after` runs to its end: the lease lasts at most one
            // window all the same, so that a clock far behind never spends
            // a window's units while the store has moved on past it.
            Algorithm::FixedWindow(p) => Slots::Window {
                deadline: taken_at_early.checked_add(reset.min(p.window_ns))?,
                available: units,
                refund_until: 0,
            },
            // `reset_after` runs to the end of the window after the charged
            // one (the charge still weighs there); the charged window ends
            // one window earlier, and the lease lasts at most one window
            // (as for fixed windows).
            Algorithm::SlidingWindow(p) => {
                let charged_left = reset.checked_sub(p.window_ns)?.min(p.window_ns);
                let deadline = taken_at_early.checked_add(charged_left)?;
                Slots::Window {
                    deadline,
                    available: units,
                    refund_until: deadline.saturating_add(p.window_ns),
                }
            }
            // `reset_after` = new TAT − t0, so the block's first slot,
            // max(t0, TAT before) = new TAT − k·T, lies `reset − k·T` after t0.
            Algorithm::Gcra(p) => {
                let span = p.emission_interval_ns.checked_mul(units)?;
                let ahead = reset.checked_sub(span)?;
                Slots::Gcra {
                    first_deadline: taken_at_early.checked_add(ahead)?,
                    interval: p.emission_interval_ns,
                    units,
                    next: 0,
                    returned: Vec::new(),
                    slot0: receipt.at_ns().checked_add(ahead)?,
                }
            }
            Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => return None,
        };
        Some(Lease {
            policy: *policy,
            receipt,
            block: *block,
            taken_at,
            spent: 0,
            wasted: 0,
            slots,
        })
    }

    /// Serves the check that asked for the block: admitted by the block's
    /// own decision, at its charge (like any admission), so no deadline
    /// applies. The first `cost` units (GCRA: unit 0, the charge's own
    /// slot); the served receipt's `at_ns`.
    pub(super) fn take_first(&mut self, cost: u64) -> Option<u64> {
        let at = match &mut self.slots {
            Slots::Window { available, .. } => {
                *available = available.checked_sub(cost)?;
                self.receipt.at_ns()
            }
            Slots::Gcra {
                units, next, slot0, ..
            } => {
                if cost != 1 || *next != 0 || *units == 0 {
                    return None;
                }
                *next = 1;
                *slot0
            }
        };
        self.spent += cost;
        Some(at)
    }

    /// Spends `cost` units at local `now` if the lease covers them: the
    /// `at_ns` of the served receipt. GCRA leases serve unit costs only.
    pub(super) fn take(&mut self, now: u64, cost: u64) -> Option<u64> {
        self.expire(now);
        let at = match &mut self.slots {
            Slots::Window {
                deadline,
                available,
                ..
            } => {
                if now >= *deadline || *available < cost {
                    return None;
                }
                *available -= cost;
                self.receipt.at_ns()
            }
            Slots::Gcra {
                units,
                next,
                returned,
                interval,
                slot0,
                ..
            } => {
                if cost != 1 {
                    return None;
                }
                // The earliest valid slot first: returned ones lie below `next`.
                let i = if let Some(pos) = min_index(returned) {
                    returned.swap_remove(pos)
                } else if *next < *units {
                    *next += 1;
                    *next - 1
                } else {
                    return None;
                };
                slot0.saturating_add(i.saturating_mul(*interval))
            }
        };
        self.spent += cost;
        Some(at)
    }

    /// Drops the units whose slot has passed at `now`, counting them wasted.
    fn expire(&mut self, now: u64) {
        match &mut self.slots {
            // Kept in `available` past the deadline, to give back.
            Slots::Window { .. } => {}
            Slots::Gcra {
                first_deadline,
                interval,
                units,
                next,
                returned,
                ..
            } => {
                let deadline = |i: u64| first_deadline.saturating_add(i.saturating_mul(*interval));
                let before = returned.len();
                returned.retain(|&i| deadline(i) >= now);
                self.wasted += (before - returned.len()) as u64;
                // Unit i may be spent up to its slot, inclusive: expired
                // once `now > slot`.
                while *next < *units && deadline(*next) < now {
                    *next += 1;
                    self.wasted += 1;
                }
            }
        }
    }

    /// The shared `remaining` the block's decision reported.
    pub(super) fn shared_remaining(&self) -> u64 {
        self.block.remaining
    }

    /// The block's size.
    pub(super) fn block_units(&self) -> u64 {
        self.receipt.units()
    }

    /// Units that may still be spent at `now`.
    pub(super) fn unspent(&mut self, now: u64) -> u64 {
        self.expire(now);
        match &self.slots {
            Slots::Window {
                deadline,
                available,
                ..
            } => {
                if now < *deadline {
                    *available
                } else {
                    0
                }
            }
            Slots::Gcra {
                units,
                next,
                returned,
                ..
            } => units - next + returned.len() as u64,
        }
    }

    /// Units that expired unspent (what shrinks the next block): call
    /// before [`Lease::give_back`].
    pub(super) fn wasted(&self) -> u64 {
        match &self.slots {
            Slots::Window { available, .. } => *available,
            Slots::Gcra { .. } => self.wasted,
        }
    }

    /// The units still in hand to give back to the inner store at `now`,
    /// as a part of the block's receipt: window leases only (GCRA: see the
    /// module docs, *Why GCRA units are not given back*). A fixed window
    /// that has ended gives nothing (its count no longer matters).
    pub(super) fn give_back(&mut self, now: u64) -> Option<Receipt> {
        let units = match &mut self.slots {
            Slots::Window {
                deadline,
                available,
                refund_until,
            } if *available > 0 && (now < *deadline || now < *refund_until) => {
                std::mem::take(available)
            }
            Slots::Window { .. } | Slots::Gcra { .. } => return None,
        };
        Some(self.receipt.part(units))
    }

    /// Puts back `units` of a served receipt taken at `at_ns` (inner
    /// clock), into the slot they were served from, if it is still valid.
    pub(super) fn put_back(&mut self, now: u64, r: &Receipt) -> PutBack {
        if r.store() != self.receipt.store() || r.permit().is_some() {
            return PutBack::NotOurs;
        }
        match &mut self.slots {
            Slots::Window {
                deadline,
                available,
                refund_until,
            } => {
                // More units than the lease has served: another charge of
                // the same instant.
                if r.at_ns() != self.receipt.at_ns() || r.units() > self.spent {
                    return PutBack::NotOurs;
                }
                if now >= *deadline {
                    return PutBack::Passed {
                        forward: now < *refund_until,
                    };
                }
                *available += r.units();
                self.spent -= r.units();
                PutBack::Local
            }
            Slots::Gcra {
                first_deadline,
                interval,
                next,
                returned,
                slot0,
                ..
            } => {
                let Some(offset) = r.at_ns().checked_sub(*slot0) else {
                    return PutBack::NotOurs;
                };
                let i = offset / *interval;
                // Only a unit this lease served: below `next`, not returned.
                if r.units() != 1 || offset % *interval != 0 || i >= *next || returned.contains(&i)
                {
                    return PutBack::NotOurs;
                }
                if first_deadline.saturating_add(i.saturating_mul(*interval)) < now {
                    return PutBack::Passed { forward: false };
                }
                returned.push(i);
                self.spent -= 1;
                PutBack::Local
            }
        }
    }

    /// The decision of a check of `cost` served from this lease at `now`
    /// (`at_ns` from [`Lease::take`]); `charged: false` for a peek of an
    /// all-or-nothing check that another rule denied.
    pub(super) fn served(&mut self, now: u64, cost: u64, at_ns: u64, charged: bool) -> Decision {
        let limit = self.policy.limit();
        // Best known: the shared remaining after the block, plus what this
        // process still holds of it.
        let remaining = self
            .block
            .remaining
            .saturating_add(self.unspent(now))
            .min(limit);
        let elapsed = Duration::from_nanos(now.saturating_sub(self.taken_at));
        let mut quota_after = self.block.quota_after.saturating_sub(elapsed);
        if remaining >= limit {
            quota_after = Duration::ZERO;
        } else if quota_after.is_zero() {
            quota_after = Duration::from_nanos(1);
        }
        let reset_after = self
            .block
            .reset_after
            .saturating_sub(elapsed)
            .max(quota_after);
        Decision {
            allowed: true,
            limit,
            remaining,
            retry_after: None,
            reset_after,
            quota_after,
            permit: None,
            decided_by: self.block.decided_by,
            charged: if charged { cost } else { 0 },
            charged_at_ns: if charged { at_ns } else { 0 },
        }
    }
}

fn min_index(v: &[u64]) -> Option<usize> {
    v.iter()
        .enumerate()
        .min_by_key(|&(_, i)| *i)
        .map(|(pos, _)| pos)
}
