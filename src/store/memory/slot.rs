//! One key's state in the memory store, and the algorithm dispatch.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::hot::{HotCell, HotSlot};
use super::locked::LockedSlot;
use crate::algorithm::gcra;
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::{Algorithm, Policy};

/// A key's state. GCRA is one atomic word (16 bytes with the tag); the others
/// sit behind a per-key mutex so the shard lock is only ever read-locked.
///
/// Every variant also carries the key's namespace (the index of the
/// per-prefix cap it counts toward), so a sweep knows which count to lower
/// without the key's bytes. It fits in the padding after the tag: a slot
/// stays 16 bytes.
pub(super) enum Slot {
    Gcra(AtomicU64, Ns),
    /// A hot GCRA key, also decided lock-free through thread caches (see `hot`).
    Hot(HotSlot, Ns),
    Other(Box<Mutex<LockedSlot>>, Ns),
}

/// The index of a key's namespace in the store's list of caps (0: the rest).
pub(super) type Ns = u32;

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

impl Slot {
    pub(super) fn fresh(policy: &Policy, ns: Ns) -> Slot {
        let Some(locked) = LockedSlot::fresh(policy) else {
            return Slot::Gcra(AtomicU64::new(0), ns);
        };
        Slot::Other(Box::new(Mutex::new(locked)), ns)
    }

    /// A fresh slot for `policy` (namespace 0) and the decision on it: what
    /// [`check`](Self::check) (or, without `admit`, a peek) on
    /// [`Slot::fresh`] gives, which always matches its policy.
    pub(super) fn decide_fresh(
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: Option<PermitId>,
        admit: bool,
    ) -> (Slot, Decision) {
        let permit = permit.unwrap_or(PermitId(0));
        match LockedSlot::decide_fresh(policy, now, cost, permit, admit) {
            Ok((other, d)) => (Slot::Other(Box::new(Mutex::new(other)), 0), d),
            Err(p) => {
                let d = gcra::check(p, 0, now, cost);
                let tat = if admit && d.allowed && cost > 0 {
                    gcra::admit(p, 0, now, cost)
                } else {
                    0
                };
                (Slot::Gcra(AtomicU64::new(tat), 0), d)
            }
        }
    }

    /// The namespace the key counts toward.
    pub(super) fn ns(&self) -> Ns {
        match self {
            Slot::Gcra(_, ns) | Slot::Hot(_, ns) | Slot::Other(_, ns) => *ns,
        }
    }

    /// Moves the slot to namespace `ns`.
    pub(super) fn set_ns(&mut self, to: Ns) {
        match self {
            Slot::Gcra(_, ns) | Slot::Hot(_, ns) | Slot::Other(_, ns) => *ns = to,
        }
    }

    /// Whether this slot holds the state `policy`'s algorithm needs.
    pub(super) fn matches(&mut self, policy: &Policy) -> bool {
        match self {
            Slot::Gcra(..) | Slot::Hot(..) => matches!(policy.algorithm(), Algorithm::Gcra(_)),
            Slot::Other(m, _) => lock_mut(m).matches(policy),
        }
    }

    /// When this key is back to a fresh state.
    pub(super) fn expires_at(&mut self) -> u64 {
        match self {
            Slot::Gcra(tat, _) => gcra::expires_at(*tat.get_mut()),
            // A lower bound: cached admissions only ever move it later.
            Slot::Hot(hot, _) => gcra::expires_at(hot.0.load()),
            Slot::Other(m, _) => lock_mut(m).expires_at(),
        }
    }

    /// For a sweep: whether the key is back to a fresh state at `now`, in
    /// which case a hot cell is retired (atomically with respect to cached
    /// admissions) and the slot may be dropped.
    pub(super) fn retire_if_cold(&mut self, now: u64) -> bool {
        match self {
            Slot::Hot(hot, _) => hot.0.retire_if_cold(now),
            Slot::Gcra(..) | Slot::Other(..) => self.expires_at() <= now,
        }
    }

    /// Moves a GCRA key's state into a hot cell (or finds the one it has);
    /// call under the shard's write lock.
    pub(super) fn promote(&mut self) -> Option<Arc<HotCell>> {
        match self {
            Slot::Gcra(tat, ns) => {
                let cell = HotCell::new(*tat.get_mut());
                *self = Slot::Hot(HotSlot(cell.clone()), *ns);
                Some(cell)
            }
            Slot::Hot(hot, _) => Some(hot.0.clone()),
            Slot::Other(..) => None,
        }
    }

    /// Takes a hot key back into the map alone (its cell retired, its final
    /// state kept), so that code holding the write lock excludes every other
    /// writer again; call under the shard's write lock.
    pub(super) fn demote(&mut self) {
        if let Slot::Hot(hot, ns) = self {
            let tat = hot.0.retire();
            *self = Slot::Gcra(AtomicU64::new(tat), *ns);
        }
    }

    /// Decides and, when allowed, admits. `None` if the slot holds another
    /// algorithm's state (the caller replaces it under the write lock).
    #[inline]
    pub(super) fn check(
        &self,
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: Option<PermitId>,
    ) -> Option<Decision> {
        self.decide(policy, now, cost, permit, true)
    }

    /// Decides without admitting.
    pub(super) fn peek_as(
        &self,
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: Option<PermitId>,
    ) -> Option<Decision> {
        self.decide(policy, now, cost, permit, false)
    }

    #[inline]
    fn decide(
        &self,
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: Option<PermitId>,
        admit: bool,
    ) -> Option<Decision> {
        match (self, policy.algorithm()) {
            (Slot::Gcra(tat, _), Algorithm::Gcra(p)) => {
                let mut current = tat.load(Ordering::Acquire);
                loop {
                    let d = gcra::check(p, current, now, cost);
                    if !(admit && d.allowed && cost > 0) {
                        return Some(d);
                    }
                    let next = gcra::admit(p, current, now, cost);
                    match tat.compare_exchange_weak(
                        current,
                        next,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return Some(d),
                        Err(actual) => current = actual,
                    }
                }
            }
            (Slot::Hot(hot, _), Algorithm::Gcra(p)) => hot.0.decide(p, now, cost, admit),
            (Slot::Other(m, _), _) => {
                let mut other = m.lock().unwrap_or_else(PoisonError::into_inner);
                let permit = permit.unwrap_or(PermitId(0));
                other.decide(policy, now, cost, permit, admit)
            }
            // A key held for another algorithm.
            (
                Slot::Gcra(..) | Slot::Hot(..),
                Algorithm::SlidingLog(_)
                | Algorithm::FixedWindow(_)
                | Algorithm::SlidingWindow(_)
                | Algorithm::Concurrency(_),
            ) => None,
        }
    }

    /// Gives a charge's units back to the slot its receipt names.
    pub(super) fn refund(&mut self, policy: &Policy, now: u64, receipt: &Receipt) {
        self.demote();
        match (self, policy.algorithm()) {
            (Slot::Gcra(tat, _), Algorithm::Gcra(p)) => {
                let t = tat.get_mut();
                *t = gcra::refund(p, *t, now, receipt);
            }
            (Slot::Other(m, _), _) => lock_mut(m).refund(policy, now, receipt),
            // Demoted above; or a key held for another algorithm.
            (Slot::Gcra(..) | Slot::Hot(..), _) => {}
        }
    }

    /// Releases one concurrency permit.
    pub(super) fn release(&mut self, policy: &Policy, permit: PermitId) {
        if let Slot::Other(m, _) = self {
            lock_mut(m).release(policy, permit);
        }
    }
}

fn lock_mut(m: &mut Mutex<LockedSlot>) -> &mut LockedSlot {
    m.get_mut().unwrap_or_else(PoisonError::into_inner)
}
