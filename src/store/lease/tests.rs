//! Unit tests of leases on a manual clock (the schedules of several
//! processes over one shared store are in `tests/lease/`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{LeaseConfigError, LeasingStore};
use crate::algorithm::gcra;
use crate::clock::{Clock, ManualClock};
use crate::decision::{Decision, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, MemoryStore, Store, StoreError};

const S: u64 = 1_000_000_000;

/// Counts the checks that reach the shared store.
struct Counting {
    inner: MemoryStore<ManualClock>,
    checks: Arc<AtomicUsize>,
}

impl Store for Counting {
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check(rule).await
    }
    async fn check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check_all(rules).await
    }
    async fn refund(&self, key: &[u8], policy: &Policy, r: &Receipt) -> Result<(), StoreError> {
        self.inner.refund(key, policy, r).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }
    fn check_now(&self, rule: Charge<'_>) -> Option<Result<Decision, StoreError>> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check_now(rule)
    }
}

struct Rig {
    clock: ManualClock,
    shared: MemoryStore<ManualClock>,
    checks: Arc<AtomicUsize>,
    store: LeasingStore<Counting>,
}

/// A leasing store over a counted memory store, both on one manual clock
/// set at the start of a window of every length used here.
fn rig(hot: u64, initial: u64, max: u64) -> Rig {
    let clock = ManualClock::starting_at(1_000 * 3_600 * S);
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let checks = Arc::new(AtomicUsize::new(0));
    let store = LeasingStore::builder(Counting {
        inner: shared.clone(),
        checks: checks.clone(),
    })
    .clock(clock.clone())
    .hot_threshold(hot)
    .initial_block(initial)
    .max_block(max)
    .blocks_per_period(1)
    .build()
    .unwrap();
    Rig {
        clock,
        shared,
        checks,
        store,
    }
}

impl Rig {
    async fn check(&self, key: &str, policy: &Policy) -> Decision {
        self.store
            .check(Charge::new(key.as_bytes(), policy, 1))
            .await
            .unwrap()
    }
    /// The shared store's `remaining`, read with a peek.
    async fn shared_remaining(&self, key: &str, policy: &Policy) -> u64 {
        let peek = Charge::new(key.as_bytes(), policy, 0);
        self.shared.check(peek).await.unwrap().remaining
    }
    fn calls(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
    fn advance(&self, ns: u64) {
        self.clock.advance(Duration::from_nanos(ns));
    }
}

fn fixed(max: u64) -> Policy {
    Policy::fixed_window(max, Duration::from_secs(1)).unwrap()
}

/// T = 1 s, limit 10.
fn gcra_policy() -> Policy {
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
async fn a_window_lease_is_spent_within_its_window_in_one_call() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    let first = r.check("hot", &p).await;
    assert_eq!(r.calls(), 1);
    assert_eq!((first.charged, first.remaining), (1, 99));
    assert_eq!(r.shared_remaining("hot", &p).await, 92, "8 charged at once");
    for left in (0..7).rev() {
        r.advance(S / 100);
        let d = r.check("hot", &p).await;
        assert!(d.allowed && d.charged == 1);
        assert_eq!(d.remaining, 92 + left, "estimate: shared + held");
        assert_eq!(r.store.local_units(b"hot"), left);
    }
    assert_eq!(r.calls(), 1, "no store call while the lease lasts");
    r.check("hot", &p).await;
    assert_eq!(r.calls(), 2, "a spent lease is replaced by a new block");
}

#[tokio::test]
async fn a_window_lease_expires_when_its_window_ends() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.advance(S / 2);
    r.check("hot", &p).await;
    r.advance(S / 2 - 1);
    assert_eq!(r.store.local_units(b"hot"), 7, "last instant of the window");
    r.advance(1);
    assert_eq!(
        r.store.local_units(b"hot"),
        0,
        "expired at the window's end"
    );
    r.check("hot", &p).await;
    assert_eq!(r.calls(), 2);
    assert_eq!(r.store.block_target(b"hot"), Some(4), "halved after waste");
    // One check in the last window: too slow for a block of more than one.
    assert_eq!(r.shared_remaining("hot", &p).await, 99);
}

#[tokio::test]
async fn a_sliding_window_lease_ends_with_its_charged_window() {
    let r = rig(1, 4, 4);
    let p = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    r.check("hot", &p).await;
    r.advance(S - 1);
    assert_eq!(r.store.local_units(b"hot"), 3);
    r.advance(1);
    assert_eq!(r.store.local_units(b"hot"), 0);
    // The next check gives the 3 back into the previous count, where they
    // still weigh: the estimate drops from 4 to 1, plus the check (one a
    // window is too slow a rate for a block).
    r.check("hot", &p).await;
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 1 - 1);
}

#[tokio::test]
async fn flush_gives_unspent_units_back_into_their_window() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    for _ in 0..3 {
        r.check("hot", &p).await;
    }
    assert_eq!(r.shared_remaining("hot", &p).await, 92);
    assert_eq!(r.store.flush().await.unwrap(), 5);
    assert_eq!(r.shared_remaining("hot", &p).await, 97);
    assert_eq!(r.store.local_units(b"hot"), 0);
    // After shutdown, every check goes to the shared store as it is.
    r.store.shutdown().await.unwrap();
    let before = r.calls();
    r.check("hot", &p).await;
    r.check("hot", &p).await;
    assert_eq!(r.calls(), before + 2);
    assert_eq!(r.shared_remaining("hot", &p).await, 95);
}

#[tokio::test]
async fn a_refund_of_a_served_check_goes_back_into_its_lease() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.check("hot", &p).await;
    let d = r.check("hot", &p).await;
    assert_eq!(r.store.local_units(b"hot"), 6);
    r.store
        .refund(b"hot", &p, &d.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"hot"), 7, "back into the local lease");
    assert_eq!(
        r.shared_remaining("hot", &p).await,
        92,
        "not into the store"
    );
    // Once the window has ended, a refund changes nothing.
    let d = r.check("hot", &p).await;
    r.advance(S);
    r.store
        .refund(b"hot", &p, &d.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"hot"), 0);
}

#[tokio::test]
async fn gcra_units_expire_at_their_slots() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    let d = r.check("g", &p).await;
    assert!(d.allowed);
    // Slots t0, t0+1 s, t0+2 s, t0+3 s; unit 0 served at t0.
    assert_eq!(r.store.local_units(b"g"), 3);
    r.advance(S);
    assert_eq!(
        r.store.local_units(b"g"),
        3,
        "unit 1 up to its slot, inclusive"
    );
    r.advance(1);
    assert_eq!(r.store.local_units(b"g"), 2, "unit 1's slot passed");
    r.advance(S / 2 - 1);
    let served = r.check("g", &p).await;
    assert_eq!(r.calls(), 1);
    let t0 = d.charged_at_ns;
    assert_eq!(
        served.charged_at_ns,
        t0 + 2 * S,
        "the receipt names unit 2's slot"
    );
    r.advance(2 * S);
    assert_eq!(r.store.local_units(b"g"), 0, "unit 3's slot passed");
    assert_eq!(r.store.block_target(b"g"), Some(4));
    r.check("g", &p).await;
    assert_eq!(r.calls(), 2);
    assert_eq!(
        r.store.block_target(b"g"),
        Some(2),
        "waste halves the block"
    );
}

#[tokio::test]
async fn a_gcra_refund_goes_back_to_its_own_slot_only() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    r.check("g", &p).await;
    let d1 = r.check("g", &p).await; // unit 1, slot t0 + 1 s
    assert_eq!(r.store.local_units(b"g"), 2);
    r.store
        .refund(b"g", &p, &d1.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"g"), 3);
    // Spent again, and refunded once its slot has passed: nothing comes
    // back, locally or in the shared store.
    let d1 = r.check("g", &p).await;
    assert_eq!(
        d1.charged_at_ns,
        r.clock.now_ns() + S,
        "the same slot again"
    );
    r.advance(S + 1);
    let before = r.shared_remaining("g", &p).await;
    r.store
        .refund(b"g", &p, &d1.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"g"), 2, "units 2 and 3 only");
    assert_eq!(r.shared_remaining("g", &p).await, before);
}

#[tokio::test]
async fn gcra_blocks_start_at_the_queue_when_it_runs_ahead() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    // Someone else took 5 units: TAT = t0 + 5 s.
    r.shared.check(Charge::new(b"g", &p, 5)).await.unwrap();
    r.check("g", &p).await; // slots t0+5 .. t0+8
    r.advance(7 * S);
    assert_eq!(
        r.store.local_units(b"g"),
        2,
        "units 2 and 3: slots t0+7, t0+8"
    );
    let Algorithm::Gcra(g) = *p.algorithm() else {
        unreachable!()
    };
    // Replayed as a sequence, the spends conform.
    let t0 = r.clock.now_ns() - 7 * S;
    let mut tat = gcra::admit(&g, 0, t0, 5);
    for u in [t0, t0 + 7 * S, t0 + 7 * S, t0 + 8 * S] {
        assert!(gcra::check(&g, tat, u, 1).allowed);
        tat = gcra::admit(&g, tat, u, 1);
    }
}

#[tokio::test]
async fn blocks_grow_when_spent_and_shrink_when_units_expire() {
    let r = rig(1, 2, 16);
    let p = fixed(1_000);
    for _ in 0..40 {
        r.check("hot", &p).await;
    }
    // Blocks 2, 4, 8, 16, then capped at 16.
    assert_eq!(r.calls(), 5);
    assert_eq!(r.store.block_target(b"hot"), Some(16));
    r.advance(S);
    r.check("hot", &p).await;
    assert_eq!(
        r.store.block_target(b"hot"),
        Some(8),
        "the ended lease wasted units"
    );
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
async fn check_now_serves_from_the_lease_in_process() {
    let r = rig(1, 4, 4);
    let p = fixed(100);
    let cold = r.store.check_now(Charge::new(b"hot", &p, 1));
    assert!(cold.is_some(), "cold: the memory store answers in process");
    let hot = r.store.check_now(Charge::new(b"hot", &p, 1));
    assert!(hot.is_none(), "hot: a block, on the asynchronous path");
    r.check("hot", &p).await;
    let calls = r.calls();
    let d = r
        .store
        .check_now(Charge::new(b"hot", &p, 1))
        .unwrap()
        .unwrap();
    assert!(d.allowed && d.charged == 1);
    assert_eq!(r.calls(), calls);
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

/// Why GCRA leases give nothing back (module docs): a refund frees the
/// tail of the queue, another process's lease. Replayed with the pure
/// functions, the schedule of the docs admits 6 units in [2 s, 3 s] where
/// GCRA allows 5.
#[test]
fn a_gcra_refund_would_free_another_lease_s_slots() {
    let Algorithm::Gcra(g) = *gcra_policy().algorithm() else {
        unreachable!()
    };
    let g = crate::algorithm::GcraParams {
        tolerance_ns: 4 * S,
        limit: 4,
        cell: None,
        ..g
    };
    let t0 = 100 * S;
    let mut tat = gcra::admit(&g, 0, t0, 2); // A, ordinary
    tat = gcra::admit(&g, tat, t0, 2); // B leases slots t0+2, t0+3
    tat = gcra::refund(&g, tat, t0, &Receipt::new(2, t0, None)); // A refunded
    assert!(gcra::check(&g, tat, t0, 2).allowed);
    tat = gcra::admit(&g, tat, t0, 2); // C leases slots t0+2, t0+3
    assert!(gcra::check(&g, tat, t0 + 2 * S, 2).allowed);
    // D's 2 at t0+2, B's and C's at t0+2 and t0+3: replayed, one fails.
    let spends = [2, 2, 2, 2, 3, 3].map(|s| t0 + s * S);
    let mut replay = 0;
    let passed = spends
        .iter()
        .take_while(|&&u| {
            let ok = gcra::check(&g, replay, u, 1).allowed;
            replay = gcra::admit(&g, replay, u, 1);
            ok
        })
        .count();
    assert_eq!(passed, 5);
}
