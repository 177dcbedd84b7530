//! Unit tests of leases on a manual clock (the schedules of several
//! processes over one shared store are in `tests/lease/`): the rig and
//! what no algorithm leases here, windows in `windows.rs`, GCRA in
//! `gcra.rs`, a block in flight in `in_flight.rs`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{LeaseConfigError, LeasingStore};
use crate::clock::{Clock, ManualClock};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::store::{Answer, AtOnce, Charge, Decisions, MemoryStore, Store, StoreError};

pub(super) const S: u64 = 1_000_000_000;

/// Counts the checks that reach the shared store; while `stall` is set,
/// checks wait (until `resume` wakes them with `stall` cleared, or a
/// caller's timeout drops them).
pub(super) struct Counting {
    inner: MemoryStore<ManualClock>,
    checks: Arc<AtomicUsize>,
    stall: Arc<AtomicBool>,
    resume: Arc<tokio::sync::Notify>,
}

impl Store for Counting {
    // A stalled store answers later, and counts a check when it is
    // polled: an answer dropped unpolled was no check.
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        if !self.stall.load(Ordering::SeqCst) || charges.len() != 1 {
            self.checks.fetch_add(1, Ordering::SeqCst);
            return Answer::Now(self.inner.decide(charges).ready().expect("in process"));
        }
        Answer::Later(async move {
            self.checks.fetch_add(1, Ordering::SeqCst);
            while self.stall.load(Ordering::SeqCst) {
                self.resume.notified().await;
            }
            self.inner.decide(charges).await
        })
    }
    async fn refund(&self, key: &[u8], policy: &Policy, r: &Receipt) -> Result<(), StoreError> {
        self.inner.refund(key, policy, r).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }
}

pub(super) struct Rig {
    pub(super) clock: ManualClock,
    pub(super) shared: MemoryStore<ManualClock>,
    checks: Arc<AtomicUsize>,
    stall: Arc<AtomicBool>,
    resume: Arc<tokio::sync::Notify>,
    pub(super) store: LeasingStore<Counting>,
}

/// A leasing store over a counted memory store, both on one manual clock
/// set at the start of a window of every length used here; without
/// prefetching (one lease at a time), as most tests here study one lease.
pub(super) fn rig(hot: u64, initial: u64, max: u64) -> Rig {
    rig_with(hot, initial, max, false)
}

/// [`rig`], prefetching or not.
pub(super) fn rig_with(hot: u64, initial: u64, max: u64, prefetch: bool) -> Rig {
    let clock = ManualClock::starting_at(1_000 * 3_600 * S);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let checks = Arc::new(AtomicUsize::new(0));
    let stall = Arc::new(AtomicBool::new(false));
    let resume = Arc::new(tokio::sync::Notify::new());
    let store = LeasingStore::builder(Counting {
        inner: shared.clone(),
        checks: checks.clone(),
        stall: stall.clone(),
        resume: resume.clone(),
    })
    .clock(clock.clone())
    .hot_threshold(hot)
    .initial_block(initial)
    .max_block(max)
    .blocks_per_period(1)
    .expiry_margin(Duration::ZERO)
    .prefetch(prefetch)
    .build()
    .unwrap();
    Rig {
        clock,
        shared,
        checks,
        stall,
        resume,
        store,
    }
}

impl Rig {
    pub(super) async fn check(&self, key: &str, policy: &Policy) -> Decision {
        self.store
            .check(Charge::new(key.as_bytes(), policy, 1))
            .await
            .unwrap()
    }
    /// The shared store's `remaining`, read with a peek.
    pub(super) async fn shared_remaining(&self, key: &str, policy: &Policy) -> u64 {
        let peek = Charge::new(key.as_bytes(), policy, 0);
        self.shared.check(peek).await.unwrap().remaining
    }
    pub(super) fn calls(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
    pub(super) fn advance(&self, ns: u64) {
        self.clock.advance(Duration::from_nanos(ns));
    }
}

fn fixed(max: u64) -> Policy {
    Policy::fixed_window(max, Duration::from_secs(1)).unwrap()
}

/// T = 1 s, limit 10.
pub(super) fn gcra_policy() -> Policy {
    Policy::cell(9, 1, Duration::from_secs(1)).unwrap()
}

#[tokio::test]
async fn cold_keys_never_lease() {
    let r = rig(5, 8, 8);
    let p = fixed(100);
    // Four checks a window, under the threshold of five: one call each.
    for i in 1..=20 {
        assert!(r.check("cold", &p).await.allowed);
        assert_eq!(r.calls(), i);
        assert_eq!(r.store.local_units(b"cold"), 0);
        if i % 4 == 0 {
            r.advance(S);
        }
    }
}

#[tokio::test]
async fn a_denied_block_falls_back_to_the_checks_own_cost() {
    let r = rig(1, 8, 8);
    let p = fixed(5);
    r.shared.check(Charge::new(b"hot", &p, 2)).await.unwrap();
    // Room for 3: the block of 5 (capped by the limit) is denied, the check is not.
    let d = r.check("hot", &p).await;
    assert!(d.allowed);
    assert_eq!(r.calls(), 2);
    assert_eq!(r.shared_remaining("hot", &p).await, 2);
    // The next block is sized by the room seen: 2 + 1.
    r.check("hot", &p).await;
    assert_eq!(r.shared_remaining("hot", &p).await, 0);
    assert!(r.check("hot", &p).await.allowed);
    assert!(!r.check("hot", &p).await.allowed);
}

#[tokio::test]
async fn lockouts_logs_and_concurrency_never_lease() {
    let r = rig(1, 8, 8);
    let policies = [
        Policy::sliding_log(100, Duration::from_secs(1)).unwrap(),
        Policy::concurrency(100).unwrap(),
    ];
    for (i, p) in policies.iter().enumerate() {
        let key = format!("k{i}");
        for _ in 0..3 {
            r.check(&key, p).await;
        }
        assert_eq!(r.store.local_units(key.as_bytes()), 0);
    }
    let p = fixed(100);
    for _ in 0..3 {
        let c = Charge::new(b"lock", &p, 1).of_penalty();
        r.store.check(c).await.unwrap();
    }
    assert_eq!(r.calls(), 9);
    assert_eq!(r.shared_remaining("lock", &p).await, 97);
}

#[tokio::test]
async fn reset_drops_the_lease_and_the_shared_state() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.check("hot", &p).await;
    r.store.reset(b"hot", &p).await.unwrap();
    assert_eq!(r.store.local_units(b"hot"), 0);
    assert_eq!(r.shared_remaining("hot", &p).await, 100);
}

#[tokio::test]
async fn a_lease_in_hand_answers_at_once_and_a_block_later() {
    let r = rig(1, 4, 4);
    let p = fixed(100);
    let cold = r.store.at_once(Charge::new(b"hot", &p, 1));
    assert!(
        cold.is_none(),
        "a new key: its first block, through a future"
    );
    assert_eq!(r.calls(), 0, "an answer dropped unpolled charged nothing");
    r.check("hot", &p).await;
    let calls = r.calls();
    let d = r
        .store
        .at_once(Charge::new(b"hot", &p, 1))
        .unwrap()
        .unwrap();
    assert!(d.allowed && d.charged == 1);
    assert_eq!(r.calls(), calls, "served from the lease");
    assert_eq!(r.store.local_units(b"hot"), 2);
}

#[test]
fn bad_settings_are_typed_errors() {
    let clock = ManualClock::new();
    let inner = || MemoryStore::builder().clock(clock.clone()).build();
    let err = LeasingStore::builder(inner())
        .max_block(0)
        .build()
        .unwrap_err();
    assert_eq!(err, LeaseConfigError::Zero("max_block"));
    let err = LeasingStore::builder(inner())
        .initial_block(10)
        .max_block(5)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        LeaseConfigError::InitialAboveMax {
            initial: 10,
            max: 5
        }
    );
    assert!(LeasingStore::builder(inner())
        .hot_threshold(0)
        .build()
        .is_err());
}
mod gcra;
mod in_flight;
mod prefetch;
mod windows;
