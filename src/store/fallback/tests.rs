use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;

const DOWN: u8 = 1;
const HANG: u8 = 2;

/// A memory store that can be taken down (connection refused) or made to
/// hang, counting the calls that reach it. Never decides synchronously, as
/// a remote store.
#[derive(Clone)]
struct Flaky {
    inner: MemoryStore<ManualClock>,
    state: Arc<AtomicU8>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(clock: &ManualClock) -> Self {
        Flaky {
            inner: MemoryStore::builder().clock(clock.clone()).build(),
            state: Arc::default(),
            calls: Arc::default(),
        }
    }

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn gate(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.state.load(Ordering::SeqCst) {
            DOWN => Err(StoreError::Connection("connection refused".into())),
            HANG => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

impl Store for Flaky {
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        self.gate().await?;
        self.inner.check(rule).await
    }
    async fn check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.gate().await?;
        self.inner.check_all(rules).await
    }
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.refund(key, policy, receipt).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.reset(key, policy).await
    }
    async fn release(&self, key: &[u8], policy: &Policy, p: PermitId) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.release(key, policy, p).await
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn setup() -> (
    ManualClock,
    Flaky,
    FallbackStore<Flaky, MemoryStore<ManualClock>>,
) {
    let clock = ManualClock::new();
    let primary = Flaky::new(&clock);
    let fallback = MemoryStore::builder().clock(clock.clone()).build();
    let store = FallbackStore::new(primary.clone(), fallback).clock(clock.clone());
    (clock, primary, store)
}

fn window(n: u64) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(3600)).unwrap()
}

#[test]
fn the_fallback_decides_while_the_primary_is_down_then_hands_back() {
    let (clock, primary, store) = setup();
    let p = window(3);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        let d = store.check(rule).await.unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.decided_by),
            (true, 2, DecidedBy::Primary)
        );
        primary.set(DOWN);
        // The fallback's own state: a fresh key, the same limit, never unlimited.
        let answers: Vec<_> = futures(&store, rule, 4).await;
        assert!(answers.iter().all(|d| d.decided_by == DecidedBy::Fallback));
        let allowed: Vec<bool> = answers.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, false]);
        assert!(store.is_on_fallback());
        // Within the probe interval the primary is not asked at all.
        assert_eq!(primary.calls(), 2, "one success, one failure");
        // Back up: nothing changes until the interval ends...
        primary.set(0);
        assert_eq!(
            store.check(rule).await.unwrap().decided_by,
            DecidedBy::Fallback
        );
        assert_eq!(primary.calls(), 2);
        // ...then the next call probes, and the primary's state is where it was.
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let d = store.check(rule).await.unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.decided_by),
            (true, 1, DecidedBy::Primary)
        );
        assert!(!store.is_on_fallback());
    });
}

async fn futures<S: Store>(store: &S, rule: Charge<'_>, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(store.check(rule).await.unwrap());
    }
    out
}

#[test]
fn a_failed_probe_keeps_the_fallback_for_another_interval() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        primary.set(DOWN);
        store.check(rule).await.unwrap();
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let d = store.check(rule).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        assert_eq!(primary.calls(), 2, "the probe reached the primary");
        clock.advance(DEFAULT_PROBE_INTERVAL / 2);
        store.check(rule).await.unwrap();
        assert_eq!(
            primary.calls(),
            2,
            "the failed probe restarted the interval"
        );
    });
}

#[test]
fn other_errors_are_not_hidden_by_the_fallback() {
    let (_clock, primary, store) = setup();
    let p = window(10);
    let twice = [Charge::new(b"k", &p, 1), Charge::new(b"k", &p, 1)];
    let err = block_on(store.check_all(&twice)).unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err}");
    assert!(!store.is_on_fallback());
    assert_eq!(primary.calls(), 1);
}

#[test]
fn permits_are_released_on_the_store_that_granted_them() {
    let (clock, primary, store) = setup();
    let p = Policy::concurrency(1).unwrap();
    let rule = Charge::new(b"c", &p, 1);
    block_on(async {
        let on_primary = store.check(rule).await.unwrap().permit.unwrap();
        primary.set(DOWN);
        let d = store.check(rule).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        let on_fallback = d.permit.unwrap();
        assert!(!store.check(rule).await.unwrap().allowed, "fallback full");
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        assert!(!store.check(rule).await.unwrap().allowed, "primary full");
        let calls = primary.calls();
        store.release(b"c", &p, on_fallback).await.unwrap();
        assert_eq!(primary.calls(), calls, "not sent to the primary");
        assert!(store.fallback().check_now(rule).unwrap().unwrap().allowed);
        store.release(b"c", &p, on_primary).await.unwrap();
        let d = store.check(rule).await.unwrap();
        assert_eq!((d.allowed, d.decided_by), (true, DecidedBy::Primary));
    });
}

#[test]
fn on_fallback_an_in_process_fallback_decides_without_a_future() {
    let (_clock, primary, store) = setup();
    let p = window(1);
    let rule = Charge::new(b"k", &p, 1);
    assert!(store.check_now(rule).is_none(), "the primary is remote");
    primary.set(DOWN);
    assert!(block_on(store.check(rule)).unwrap().allowed);
    let d = store.check_now(rule).expect("decided at once").unwrap();
    assert_eq!((d.allowed, d.decided_by), (false, DecidedBy::Fallback));
    let ds = store
        .check_all_now(&[rule])
        .expect("decided at once")
        .unwrap();
    assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
}

#[test]
fn a_probe_dropped_mid_call_lets_the_next_call_probe() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    primary.set(DOWN);
    block_on(store.check(rule)).unwrap();
    clock.advance(DEFAULT_PROBE_INTERVAL);
    primary.set(HANG);
    {
        let mut probe = Box::pin(store.check(rule));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(probe.as_mut().poll(&mut cx), Poll::Pending));
        // While it hangs, others are answered by the fallback.
        let d = block_on(store.check(rule)).unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
    }
    primary.set(0);
    let d = block_on(store.check(rule)).unwrap();
    assert_eq!(d.decided_by, DecidedBy::Primary, "the claim was given back");
}

/// A reset reaches both stores; while the primary is out it is no error
/// (a lock-out resets strikes on every lock): the fallback alone is reset.
#[test]
fn reset_reaches_both_stores_and_the_fallback_alone_in_an_outage() {
    let (clock, primary, store) = setup();
    let p = window(1);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        store.check(rule).await.unwrap();
        primary.set(DOWN);
        store.check(rule).await.unwrap();
        store.reset(b"k", &p).await.unwrap();
        assert!(store.fallback().check_now(rule).unwrap().unwrap().allowed);
        // The primary kept its count: it was out.
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        assert!(
            !store.check(rule).await.unwrap().allowed,
            "the primary's unit"
        );
        assert_eq!(
            store.check(rule).await.unwrap().decided_by,
            DecidedBy::Primary
        );
        // Both answer: both are reset.
        store.reset(b"k", &p).await.unwrap();
        let peek = Charge::new(b"k", &p, 0);
        assert_eq!(store.primary().check(peek).await.unwrap().remaining, 1);
    });
}

#[test]
fn fallback_permit_ids_are_forgotten_once_their_lease_is_over() {
    let (clock, primary, store) = setup();
    let p = Policy::concurrency_with_lease(1, Duration::from_secs(1)).unwrap();
    primary.set(DOWN);
    block_on(async {
        for i in 0..(MIN_PRUNE_AT as u64 * 3) {
            let key = i.to_be_bytes();
            let d = store.check(Charge::new(&key, &p, 1)).await.unwrap();
            assert!(d.allowed);
            clock.advance(Duration::from_millis(10));
        }
    });
    let held = store.shared.permits.lock().unwrap().map.len();
    assert!(held <= MIN_PRUNE_AT, "{held} permit ids kept");
}

/// Under a caller's budget (a layer's `store_timeout`) shorter than a
/// stalled primary takes, the primary gets three quarters of it and the
/// fallback answers within it: the caller's timeout is never reached.
/// The failure opens the probe interval as any other.
#[test]
fn a_stalled_primary_leaves_the_fallback_its_part_of_the_callers_budget() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    primary.set(HANG);
    let budget = Duration::from_millis(50);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let started = tokio::time::Instant::now();
        let d = budget::within(budget, store.check(rule)).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        assert!(started.elapsed() < budget, "{:?}", started.elapsed());
        assert!(store.is_on_fallback());
        let ds = budget::within(budget, store.check_all(&[rule]))
            .await
            .unwrap();
        assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
        assert_eq!(primary.calls(), 1, "not asked within the probe interval");
        // The probe after the interval stalls too: its share, then the fallback.
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let started = tokio::time::Instant::now();
        let ds = budget::within(budget, store.check_all(&[rule]))
            .await
            .unwrap();
        assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
        assert!(started.elapsed() < budget, "{:?}", started.elapsed());
        assert_eq!(primary.calls(), 2);
        // Without a budget the primary's own bound applies (here: none).
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let alone = tokio::time::timeout(Duration::from_secs(3600), store.check(rule)).await;
        assert!(alone.is_err(), "no share without a caller's budget");
    });
}

/// A refund goes to the store that took the charge, whichever decides now:
/// units taken on the fallback during an outage go back to the fallback
/// after the primary is back (not to the primary's count), and units taken
/// on the primary go back to the primary.
#[test]
fn refunds_go_to_the_store_that_took_the_charge() {
    let (clock, primary, store) = setup();
    let p = window(2);
    let rule = Charge::new(b"k", &p, 1);
    let peek = Charge::new(b"k", &p, 0);
    block_on(async {
        let on_primary = store.check(rule).await.unwrap();
        assert_eq!(on_primary.decided_by, DecidedBy::Primary);
        primary.set(DOWN);
        let on_fallback = store.check(rule).await.unwrap();
        assert_eq!(on_fallback.decided_by, DecidedBy::Fallback);
        let fallback_receipt = on_fallback.receipt().unwrap();
        assert_eq!(fallback_receipt.store(), DecidedBy::Fallback);

        // Back on the primary: the fallback's unit returns to the fallback.
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        store.refund(b"k", &p, &fallback_receipt).await.unwrap();
        assert_eq!(
            store.fallback().check_now(peek).unwrap().unwrap().remaining,
            2
        );
        assert_eq!(
            store.primary().check(peek).await.unwrap().remaining,
            1,
            "untouched"
        );

        // The primary's unit returns to the primary, even while it is out
        // (then the refund fails and the unit stays counted).
        primary.set(DOWN);
        let receipt = on_primary.receipt().unwrap();
        assert!(store
            .refund(b"k", &p, &receipt)
            .await
            .unwrap_err()
            .is_unavailable());
        primary.set(0);
        store.refund(b"k", &p, &receipt).await.unwrap();
        assert_eq!(store.primary().check(peek).await.unwrap().remaining, 2);
    });
}

/// A concurrency permit taken on the fallback is refunded by its own id
/// there (the fallback's ids are renumbered by the pair).
#[test]
fn a_fallback_permit_is_refunded_by_its_own_lease() {
    let (_clock, primary, store) = setup();
    let p = Policy::concurrency_with_lease(2, Duration::from_secs(60)).unwrap();
    let rule = Charge::new(b"c", &p, 1);
    primary.set(DOWN);
    block_on(async {
        let first = store.check(rule).await.unwrap();
        let second = store.check(rule).await.unwrap();
        assert!(first.allowed && second.allowed);
        assert!(!store.check(rule).await.unwrap().allowed, "two in flight");
        store
            .refund(b"c", &p, &first.receipt().unwrap())
            .await
            .unwrap();
        assert!(
            store.check(rule).await.unwrap().allowed,
            "the first's lease is gone"
        );
        // The second still holds its own.
        assert!(!store.check(rule).await.unwrap().allowed);
    });
}
