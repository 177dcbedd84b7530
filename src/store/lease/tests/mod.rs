//! Unit tests of leases on a manual clock (the schedules of several
//! processes over one shared store are in `tests/lease/`): windows here,
//! GCRA in `gcra.rs`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{LeaseConfigError, LeasingStore};
use crate::clock::{Clock, ManualClock};
use crate::decision::{Decision, Receipt};
use crate::policy::Policy;
use crate::store::{Charge, MemoryStore, Store, StoreError};

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
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        while self.stall.load(Ordering::SeqCst) {
            self.resume.notified().await;
        }
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

/// Takes a lease of `p` (fixed window of 1 s) on key `hot` half a window
/// before the key's stored window, written by a clock ahead of this one.
async fn lease_behind(r: &Rig, p: &Policy) {
    let start = r.clock.now_ns();
    r.clock.set_ns(start + S);
    let ahead = Charge::new(b"hot", p, 1);
    assert!(r.shared.check(ahead).await.unwrap().allowed);
    r.clock.set_ns(start + S / 2);
    let first = r.check("hot", p).await;
    assert!(first.allowed);
    assert_eq!(first.charged_at_ns, start + S, "the window it counted in");
    assert_eq!(first.reset_after, Duration::from_nanos(3 * S / 2));
    assert_eq!(r.store.local_units(b"hot"), 7);
}

/// A block charged while the shared key holds a later window (another
/// instance's clock ahead) counts in that window, and its receipt names it:
/// the lease never outlives that window, lasts at most one window from its
/// taking (a clock far behind never spends a window's units after the
/// store moved on), and gives its unspent units back there, as
/// `tests/redis/redis_lease.rs` asserts of four real instances.
#[tokio::test]
async fn a_block_counted_in_a_later_window_is_spent_and_given_back_there() {
    let p = fixed(100);
    // The window it counts in ends 1.5 s after the lease was taken; the
    // lease, one window after.
    let r = rig(1, 8, 8);
    lease_behind(&r, &p).await;
    r.advance(S - 1);
    assert_eq!(r.store.local_units(b"hot"), 7, "for one window");
    r.advance(1);
    assert_eq!(r.store.local_units(b"hot"), 0, "no longer");
    let calls = r.calls();
    r.check("hot", &p).await;
    assert_eq!(r.calls(), calls + 1, "not served from the lease");
    // Unspent units go back into that window (a receipt naming the
    // instant's window would be ignored there: 100 - 1 - 8).
    let r = rig(1, 8, 8);
    lease_behind(&r, &p).await;
    r.advance(S - 1);
    assert_eq!(r.shared_remaining("hot", &p).await, 91);
    r.store.flush().await.unwrap();
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 1 - 1);
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

/// The last clone dropped inside a Tokio runtime gives the unspent units
/// back, on a task of that runtime.
#[tokio::test]
async fn dropping_the_store_gives_unspent_units_back() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    for _ in 0..3 {
        r.check("hot", &p).await;
    }
    assert_eq!(r.shared_remaining("hot", &p).await, 92);
    let Rig { store, shared, .. } = r;
    let clone = store.clone();
    drop(store);
    tokio::task::yield_now().await;
    assert_eq!(
        shared
            .check(Charge::new(b"hot", &p, 0))
            .await
            .unwrap()
            .remaining,
        92,
        "a clone still holds the lease"
    );
    drop(clone);
    // The give-back runs on a task of this runtime: bounded yields, no sleep.
    let mut remaining = 92;
    for _ in 0..100 {
        tokio::task::yield_now().await;
        remaining = shared
            .check(Charge::new(b"hot", &p, 0))
            .await
            .unwrap()
            .remaining;
        if remaining == 97 {
            break;
        }
    }
    assert_eq!(remaining, 97);
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

/// A check dropped while its block is asked for (a caller's timeout) does
/// not leave the key unable to lease.
#[tokio::test]
async fn a_block_dropped_in_flight_does_not_stop_the_key_leasing() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    {
        let mut asking = std::pin::pin!(r.check("hot", &p));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(asking.as_mut().poll(&mut cx).is_pending());
    }
    r.stall.store(false, Ordering::SeqCst);
    r.check("hot", &p).await;
    assert_eq!(r.store.local_units(b"hot"), 7);
}

/// Checks of a key whose block is on its way wait for it: one store call
/// for the block, not one per check meanwhile.
#[tokio::test]
async fn checks_wait_for_the_block_in_flight_instead_of_asking_the_store() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut first = std::pin::pin!(r.check("hot", &p));
    assert!(first.as_mut().poll(&mut cx).is_pending());
    let mut waiting: Vec<_> = (0..3).map(|_| Box::pin(r.check("hot", &p))).collect();
    for check in &mut waiting {
        assert!(check.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(r.calls(), 1, "only the block was asked for");
    r.stall.store(false, Ordering::SeqCst);
    r.resume.notify_waiters();
    assert!(first.await.allowed);
    for check in waiting {
        assert!(check.await.allowed);
    }
    assert_eq!(r.calls(), 1);
    assert_eq!(r.store.local_units(b"hot"), 8 - 4);
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 8);
}

/// A block that fails wakes its waiters, which then ask the store
/// themselves: nobody waits for a block that never comes.
#[tokio::test]
async fn waiters_go_on_when_the_block_is_dropped() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut waiter = Box::pin(r.check("hot", &p));
    {
        let mut first = std::pin::pin!(r.check("hot", &p));
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(waiter.as_mut().poll(&mut cx).is_pending());
        // The block's caller gives up (a timeout): dropped here.
    }
    r.stall.store(false, Ordering::SeqCst);
    r.resume.notify_waiters();
    assert!(waiter.await.allowed);
    // The waiter took a block of its own.
    assert_eq!(r.calls(), 2);
    assert_eq!(r.store.local_units(b"hot"), 7);
}

mod gcra;
mod prefetch;
