//! The lock-free path of hot GCRA keys.
//!
//! A shard's read lock costs two atomic read-modify-writes per check, as
//! much again as the check's own compare-and-swap. A key that one thread
//! checks several times in a row (a global limit, a busy user, an abusive
//! client) is therefore *promoted*: its state moves into a [`HotCell`]
//! shared by the map and by a one-entry cache in each thread that uses it,
//! and that thread then decides the key with one compare-and-swap on the
//! cell and no lock.
//!
//! Soundness rests on one rule: the cell's state word is the only state of
//! its key, and a cell leaves the map only by atomically swapping in
//! [`RETIRED`], which never changes again. Whoever takes the cell out
//! (sweep, reset, a multi-rule check, a refund) thereby reads the final
//! state, so no admission is lost or counted twice; a thread whose cached
//! cell is retired falls back to the map. Only hot keys pay for a cell
//! (an `Arc`, 24 bytes); idle keys keep the plain 16-byte slot.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::algorithm::gcra;
use crate::decision::Decision;
use crate::policy::GcraParams;

/// The state word of a cell that has left its map.
pub(super) const RETIRED: u64 = u64::MAX;

/// Consecutive checks of one key by one thread before it is promoted.
const PROMOTE_AFTER: u32 = 4;

/// A hot key's GCRA state (`tat`), shared by its map slot and the caches.
#[derive(Debug)]
pub(super) struct HotCell {
    tat: AtomicU64,
}

impl HotCell {
    /// A live cell holding `tat`. `RETIRED` is reserved: a tat saturated at
    /// `u64::MAX` is kept one nanosecond earlier (in the year 2554).
    pub(super) fn new(tat: u64) -> Arc<Self> {
        Arc::new(HotCell {
            tat: AtomicU64::new(tat.min(RETIRED - 1)),
        })
    }

    /// Decides and, when `admit` and allowed, admits; `None` once retired.
    #[inline(always)]
    pub(super) fn decide(
        &self,
        p: &GcraParams,
        now: u64,
        cost: u64,
        admit: bool,
    ) -> Option<Decision> {
        let mut current = self.tat.load(Ordering::Acquire);
        loop {
            if current == RETIRED {
                return None;
            }
            let d = gcra::check(p, current, now, cost);
            if !(admit && d.allowed && cost > 0) {
                return Some(d);
            }
            let next = gcra::admit(p, current, now, cost).min(RETIRED - 1);
            match self
                .tat
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(d),
                Err(actual) => current = actual,
            }
        }
    }

    /// Admits `cost` units when GCRA allows them and returns the state the
    /// decision was made on (`None` once retired): the caller renders the
    /// decision with `gcra::check` on it, where it returns it, instead of
    /// receiving one made here (moving 104 bytes through two enums cost a
    /// hot check a quarter of its time).
    #[inline(always)]
    pub(super) fn admit_state(&self, p: &GcraParams, now: u64, cost: u64) -> Option<u64> {
        let mut current = self.tat.load(Ordering::Acquire);
        loop {
            if current == RETIRED {
                return None;
            }
            let next = match gcra::admits(p, current, now, cost) {
                Some(next) if cost > 0 => next.min(RETIRED - 1),
                // Denied, or a peek: nothing to write.
                _ => return Some(current),
            };
            match self
                .tat
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(current),
                Err(actual) => current = actual,
            }
        }
    }

    /// [`decide`](Self::decide) with `admit`, for a caller that reads
    /// nothing of an admission; `None` once retired.
    #[inline(always)]
    pub(super) fn admit(&self, p: &GcraParams, now: u64, cost: u64) -> Option<Brief> {
        admit_on(&self.tat, p, now, cost, true)
    }

    /// The current state (never `RETIRED` while the cell is in its map).
    pub(super) fn load(&self) -> u64 {
        self.tat.load(Ordering::Acquire)
    }

    /// Takes the cell out of service; returns its final state.
    pub(super) fn retire(&self) -> u64 {
        self.tat.swap(RETIRED, Ordering::AcqRel)
    }

    /// Retires the cell if its key is back to a fresh state at `now`;
    /// returns whether it did. Races with admissions through the caches.
    pub(super) fn retire_if_cold(&self, now: u64) -> bool {
        let mut current = self.load();
        loop {
            if current == RETIRED {
                return true;
            }
            if gcra::expires_at(current) > now {
                return false;
            }
            match self.tat.compare_exchange_weak(
                current,
                RETIRED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }
}

/// The answer of a check without figures (see `MemoryStore::admit_sync`).
#[derive(Clone, Copy)]
pub(super) enum Brief {
    /// Allowed and admitted; the decision's figures were not computed.
    Admitted,
    /// Denied on this state word: the caller renders the decision where it
    /// returns it (a decision made here would be copied through every
    /// wrapper on the way).
    Denied(u64),
}

/// Admits `cost` units on the state word `tat` when GCRA allows them, with
/// no decision; a denial reports the state it was decided on. `hot`: the
/// word is a hot cell's, where `RETIRED` is reserved (`None` once retired;
/// admitted states kept below it, as [`HotCell::decide`] does); a plain map
/// slot's word takes any value, as `Slot::decide` writes it.
#[inline(always)]
pub(super) fn admit_on(
    tat: &AtomicU64,
    p: &GcraParams,
    now: u64,
    cost: u64,
    hot: bool,
) -> Option<Brief> {
    let mut current = tat.load(Ordering::Acquire);
    loop {
        if hot && current == RETIRED {
            return None;
        }
        let Some(next) = gcra::admits(p, current, now, cost) else {
            return Some(Brief::Denied(current));
        };
        if cost == 0 {
            return Some(Brief::Admitted);
        }
        let next = if hot { next.min(RETIRED - 1) } else { next };
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(Brief::Admitted),
            Err(actual) => current = actual,
        }
    }
}

/// The map's handle of a hot cell: dropping it (the slot removed, replaced
/// or the store dropped) retires the cell, so no cache can write a state
/// the map no longer holds.
#[derive(Debug)]
pub(super) struct HotSlot(pub(super) Arc<HotCell>);

impl Drop for HotSlot {
    fn drop(&mut self) {
        self.0.retire();
    }
}

/// What a thread remembers: the hot cell it uses, and the key it has been
/// checking lately (to decide a promotion). Cells, not a `RefCell`: the
/// fast path is a few loads and no borrow flag.
struct ThreadHotCache {
    store: Cell<u64>,
    hash: Cell<u64>,
    cell: Cell<Option<Arc<HotCell>>>,
    streak: Cell<u32>,
}

thread_local! {
    static CACHE: ThreadHotCache = const {
        ThreadHotCache {
            store: Cell::new(0),
            hash: Cell::new(0),
            cell: Cell::new(None),
            streak: Cell::new(0),
        }
    };
}

/// The answer of [`check`].
pub(super) enum Lookup<R = Decision> {
    /// Decided on this thread's hot cell.
    Hit(R),
    /// Not cached: decide through the map, then promote the key if asked.
    Miss { promote: bool },
}

/// Checks `hash` of store `store` on this thread's hot cell, if it holds
/// that key (the state the decision is made on: see
/// [`HotCell::admit_state`]); otherwise counts the check towards a
/// promotion.
#[inline(always)]
pub(super) fn check(store: u64, hash: u64, p: &GcraParams, now: u64, cost: u64) -> Lookup<u64> {
    check_with(store, hash, |cell| cell.admit_state(p, now, cost))
}

/// [`check`], deciding on the cached cell with `decide` (`None`: retired).
#[inline(always)]
pub(super) fn check_with<R>(
    store: u64,
    hash: u64,
    decide: impl FnOnce(&HotCell) -> Option<R>,
) -> Lookup<R> {
    CACHE
        .try_with(|c| {
            if c.store.get() == store && c.hash.get() == hash {
                if let Some(cell) = c.cell.take() {
                    if let Some(d) = decide(&cell) {
                        c.cell.set(Some(cell));
                        return Lookup::Hit(d);
                    }
                    // Retired (dropped here): back to the map, maybe a new cell.
                    c.streak.set(0);
                }
                c.streak.set(c.streak.get().saturating_add(1));
            } else {
                c.store.set(store);
                c.hash.set(hash);
                c.cell.set(None);
                c.streak.set(1);
            }
            Lookup::Miss {
                promote: c.streak.get() >= PROMOTE_AFTER,
            }
        })
        .unwrap_or(Lookup::Miss { promote: false })
}

/// Makes `cell` this thread's hot cell for `hash` of store `store`.
pub(super) fn cache(store: u64, hash: u64, cell: Arc<HotCell>) {
    let _ = CACHE.try_with(|c| {
        c.store.set(store);
        c.hash.set(hash);
        c.cell.set(Some(cell));
        c.streak.set(0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, Policy};
    use std::time::Duration;

    fn params() -> GcraParams {
        let Algorithm::Gcra(p) = *Policy::cell(2, 1, Duration::from_secs(1))
            .unwrap()
            .algorithm()
        else {
            unreachable!()
        };
        p
    }

    #[test]
    fn a_retired_cell_decides_nothing_and_keeps_its_last_state() {
        let p = params();
        let cell = HotCell::new(0);
        let now = 10_000_000_000;
        assert!(cell.decide(&p, now, 1, true).unwrap().allowed);
        let admitted = cell.load();
        assert_eq!(admitted, gcra::admit(&p, 0, now, 1));
        assert_eq!(
            cell.retire(),
            admitted,
            "the swap hands over the last state"
        );
        assert!(cell.decide(&p, now, 1, true).is_none());
        assert_eq!(cell.load(), RETIRED);
        // Dropping the map's handle retires a live cell too.
        let other = HotCell::new(0);
        drop(HotSlot(other.clone()));
        assert!(other.decide(&p, now, 1, true).is_none());
    }

    #[test]
    fn only_a_cold_cell_is_retired_by_a_sweep() {
        let p = params();
        let now = 10_000_000_000;
        let cell = HotCell::new(0);
        cell.decide(&p, now, 1, true).unwrap();
        assert!(!cell.retire_if_cold(now), "just admitted: still live");
        assert!(cell.retire_if_cold(now + 1_000_000_000));
        assert!(cell.decide(&p, now, 1, true).is_none());
    }

    #[test]
    fn the_state_an_admission_reports_renders_the_decision_the_cell_makes() {
        // Two cells driven alike: one decides, the other reports the state
        // it decided on; `gcra::check` on that state is the same decision.
        for (limit, cost, step) in [(2, 1, 1), (5, 2, 300_000_000), (0, 1, 7), (3, 0, 1)] {
            let Algorithm::Gcra(p) = *Policy::cell(limit, 1, Duration::from_secs(1))
                .unwrap()
                .algorithm()
            else {
                unreachable!()
            };
            let (deciding, reporting) = (HotCell::new(0), HotCell::new(0));
            let mut now = 10_000_000_000;
            for _ in 0..40 {
                let d = deciding.decide(&p, now, cost, true).unwrap();
                let tat = reporting.admit_state(&p, now, cost).unwrap();
                assert_eq!(gcra::check(&p, tat, now, cost), d);
                assert_eq!(deciding.load(), reporting.load());
                now += step;
            }
        }
        let retired = HotCell::new(0);
        retired.retire();
        assert!(retired.admit_state(&params(), 0, 1).is_none());
    }

    #[test]
    fn a_saturated_state_is_never_mistaken_for_retired() {
        let cell = HotCell::new(u64::MAX);
        assert_eq!(cell.load(), RETIRED - 1);
    }

    #[test]
    fn promotion_needs_a_run_of_one_key_on_one_store() {
        let p = params();
        let promote = |store, hash| match check(store, hash, &p, 0, 1) {
            Lookup::Miss { promote } => promote,
            Lookup::Hit(_) => panic!("nothing cached yet"),
        };
        let runs: Vec<bool> = (0..PROMOTE_AFTER).map(|_| promote(1, 7)).collect();
        assert_eq!(runs.last(), Some(&true));
        assert!(runs[..runs.len() - 1].iter().all(|&p| !p));
        assert!(!promote(2, 7), "another store breaks the run");
        assert!(!promote(1, 8), "another key breaks the run");
    }
}
