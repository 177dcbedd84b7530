//! Leases with the rest of the crate: all-or-nothing checks of a leased
//! rule and an unleased one, refunds through receipts (a `Limiter`'s), the
//! fallback store, and lock-outs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::decision::{DecidedBy, Receipt};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Charge, FallbackStore, MemoryStore, Outage, Store, StoreError};
use tower_throttle::Policy;

use crate::counting_store::CountingStore;
use crate::peek::remaining;

const S: u64 = 1_000_000_000;

type Shared = Arc<CountingStore<MemoryStore<ManualClock>>>;

fn shared(clock: &ManualClock) -> Shared {
    Arc::new(CountingStore::new(
        MemoryStore::builder().clock(clock.clone()).build(),
    ))
}

fn leasing<S: Store>(inner: S, clock: &ManualClock) -> LeasingStore<S> {
    LeasingStore::builder(inner)
        .clock(clock.clone())
        .hot_threshold(3)
        .initial_block(8)
        .max_block(8)
        .blocks_per_period(1)
        .expiry_margin(Duration::ZERO)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_leased_rule_and_an_unleased_one_are_all_or_nothing() {
    let clock = ManualClock::starting_at(3_600 * S);
    let inner = shared(&clock);
    let store = leasing(inner.clone(), &clock);
    let global = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    let user = Policy::fixed_window(2, Duration::from_secs(1)).unwrap();
    let check = |u: &'static [u8]| {
        let store = store.clone();
        let (global, user) = (global, user);
        async move {
            let rules = [Charge::new(b"g", &global, 1), Charge::new(u, &user, 1)];
            store.check_all(&rules).await.unwrap()
        }
    };
    // Cold: one call each; the third check takes a block of the global key
    // in the same call as the user's charge.
    for u in [b"u1", b"u2", b"u3"] {
        let ds = check(u).await;
        assert!(ds.iter().all(|d| d.allowed));
    }
    assert_eq!(inner.checks(), 3);
    assert_eq!(store.local_units(b"g"), 7);
    assert_eq!(remaining(&inner.inner, b"g", &global).await, 100 - 2 - 8);
    // Served from the lease: the shared store sees the user's rule alone.
    let ds = check(b"u1").await;
    assert!(ds.iter().all(|d| d.allowed));
    assert_eq!(store.local_units(b"g"), 6);
    assert_eq!(inner.checks(), 4);
    // The user's rule denies: the global unit goes back into the lease, and
    // the global rule reports a peek.
    let ds = check(b"u1").await;
    assert!(!ds[1].allowed);
    assert!(ds[0].allowed && ds[0].charged == 0 && ds[0].receipt().is_none());
    assert_eq!(store.local_units(b"g"), 6);
    assert_eq!(remaining(&inner.inner, b"u1", &user).await, 0);
    assert_eq!(remaining(&inner.inner, b"g", &global).await, 90);
}

#[tokio::test]
async fn a_block_denied_in_a_multi_rule_check_retries_with_the_checks_costs() {
    let clock = ManualClock::starting_at(3_600 * S);
    let inner = shared(&clock);
    let store = leasing(inner.clone(), &clock);
    let global = Policy::fixed_window(10, Duration::from_secs(1)).unwrap();
    let user = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    let rules = [Charge::new(b"g", &global, 1), Charge::new(b"u", &user, 1)];
    inner
        .inner
        .check(Charge::new(b"g", &global, 3))
        .await
        .unwrap();
    for _ in 0..2 {
        store.check_all(&rules).await.unwrap();
    }
    // Room for 5 seen; another process then takes 4 of them.
    inner
        .inner
        .check(Charge::new(b"g", &global, 4))
        .await
        .unwrap();
    // The block of 5 is denied with the user's charge (nothing charged),
    // and the check passes with its own costs in a second call.
    let ds = store.check_all(&rules).await.unwrap();
    assert!(ds.iter().all(|d| d.allowed && d.charged == 1));
    assert_eq!(inner.checks(), 4);
    assert_eq!(store.local_units(b"g"), 0);
    assert_eq!(remaining(&inner.inner, b"u", &user).await, 97);
    assert_eq!(remaining(&inner.inner, b"g", &global).await, 0);
}

#[tokio::test]
async fn a_limiter_s_refund_goes_back_through_the_receipt() {
    let clock = ManualClock::starting_at(3_600 * S);
    let inner = shared(&clock);
    let store = leasing(inner.clone(), &clock);
    let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    let mut last = None;
    for _ in 0..4 {
        last = Some(store.check(Charge::new(b"k", &policy, 1)).await.unwrap());
    }
    let served = last.unwrap();
    assert_eq!(
        store.local_units(b"k"),
        6,
        "a block of 8 taken by the 3rd check"
    );
    store
        .refund(b"k", &policy, &served.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(store.local_units(b"k"), 7);
    // A receipt of another charge (not the lease's) goes to the shared store.
    let other = inner
        .inner
        .check(Charge::new(b"k", &policy, 2))
        .await
        .unwrap();
    let before = remaining(&inner.inner, b"k", &policy).await;
    store
        .refund(b"k", &policy, &other.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(remaining(&inner.inner, b"k", &policy).await, before + 2);
    // Shutdown gives the 7 held units back into their window.
    assert_eq!(store.shutdown().await.unwrap(), 7);
    assert_eq!(remaining(&inner.inner, b"k", &policy).await, before + 2 + 7);
}

/// A primary that fails as unavailable while `down` is set, and refuses
/// every request as malformed while `refuse` is.
#[derive(Clone)]
struct Flaky {
    inner: Shared,
    down: Arc<AtomicBool>,
    refuse: Arc<AtomicBool>,
}

impl Flaky {
    fn new(inner: Shared) -> Self {
        Flaky {
            inner,
            down: Arc::default(),
            refuse: Arc::default(),
        }
    }

    fn gate(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable(Outage::Loading))
        } else if self.refuse.load(Ordering::SeqCst) {
            Err(StoreError::InvalidRequest("refused by the test"))
        } else {
            Ok(())
        }
    }
}

impl Store for Flaky {
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        tower_throttle::store::Answer::Later(async move {
            self.gate()?;
            self.inner.decide(charges).await
        })
    }
    async fn refund(&self, key: &[u8], policy: &Policy, r: &Receipt) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.refund(key, policy, r).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.gate()?;
        self.inner.reset(key, policy).await
    }
}

type Pair = FallbackStore<Flaky, MemoryStore<ManualClock>>;

/// A leasing store over a fallback pair: a primary that can be taken
/// down, and a memory store.
fn over_a_fallback_pair(
    clock: &ManualClock,
) -> (Flaky, MemoryStore<ManualClock>, LeasingStore<Pair>) {
    let primary = Flaky::new(shared(clock));
    let fallback = MemoryStore::builder().clock(clock.clone()).build();
    let pair = FallbackStore::new(primary.clone(), fallback.clone())
        .clock(clock.clone())
        .probe_interval(Duration::ZERO);
    (primary, fallback, leasing(pair, clock))
}

#[tokio::test]
async fn a_lease_ends_when_the_primary_fails() {
    let clock = ManualClock::starting_at(3_600 * S);
    let (primary, fallback, store) = over_a_fallback_pair(&clock);
    let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    for _ in 0..4 {
        store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
    }
    assert_eq!(store.local_units(b"k"), 6);
    primary.down.store(true, Ordering::SeqCst);
    // The lease is spent until the store is asked: the first check served
    // in process; once a check reaches the store and the fallback decides,
    // every lease ends and nothing is leased from the fallback.
    for _ in 0..6 {
        store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
    }
    let d = store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
    assert_eq!(d.decided_by, DecidedBy::Fallback);
    assert_eq!(store.local_units(b"k"), 0);
    for _ in 0..5 {
        let d = store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        assert_eq!(d.charged, 1);
        assert_eq!(store.local_units(b"k"), 0);
    }
    // The fallback was charged one unit per check, not blocks.
    assert_eq!(remaining(&fallback, b"k", &policy).await, 94);
    // Back on the primary: leasing again.
    primary.down.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(1));
    for _ in 0..4 {
        let d = store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Primary);
    }
    assert!(store.local_units(b"k") > 0);
}

/// A block prefetched in the background while the primary is down is
/// decided by the fallback: admitted there, it is not leased and goes back;
/// denied there (less room than a block), nothing is charged. Either way
/// every lease ends with the primary.
#[tokio::test]
async fn a_block_prefetched_from_the_fallback_is_not_leased() {
    for taken in [0, 95] {
        let clock = ManualClock::starting_at(3_600 * S);
        let (primary, fallback, store) = over_a_fallback_pair(&clock);
        let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
        // Another instance's use of the fallback.
        let other = fallback.check(Charge::new(b"k", &policy, taken)).await;
        assert!(other.unwrap().allowed);
        // Two cold checks, then a block of 8 (7 left after its own check).
        for _ in 0..3 {
            store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
        }
        assert_eq!(store.local_units(b"k"), 7);
        primary.down.store(true, Ordering::SeqCst);
        // Down to a quarter: the next block is asked for in the background.
        for _ in 0..5 {
            let d = store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
            assert_eq!(d.decided_by, DecidedBy::Primary, "served from the lease");
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let ended = store.local_units(b"k");
        assert_eq!(ended, 0, "{taken}: the leases ended with the primary");
        let room = remaining(&fallback, b"k", &policy).await;
        assert_eq!(room, 100 - taken, "{taken}: nothing of the block kept");
        let d = store.check(Charge::new(b"k", &policy, 1)).await.unwrap();
        assert_eq!((d.decided_by, d.charged), (DecidedBy::Fallback, 1));
    }
}

#[tokio::test]
async fn an_unavailable_store_ends_every_lease_and_a_bad_request_none() {
    let clock = ManualClock::starting_at(3_600 * S);
    let primary = Flaky::new(shared(&clock));
    let store = leasing(primary.clone(), &clock);
    let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    for _ in 0..3 {
        store.check(Charge::new(b"hot", &policy, 1)).await.unwrap();
    }
    assert_eq!(store.local_units(b"hot"), 7);
    // A request the store refuses as malformed ends no lease.
    primary.refuse.store(true, Ordering::SeqCst);
    let err = store.check(Charge::new(b"cold", &policy, 1)).await;
    assert!(!err.unwrap_err().is_unavailable());
    assert_eq!(store.local_units(b"hot"), 7);
    primary.refuse.store(false, Ordering::SeqCst);
    primary.down.store(true, Ordering::SeqCst);
    // Served in process while the store is down: no call, no error.
    store.check(Charge::new(b"hot", &policy, 1)).await.unwrap();
    let err = store.check(Charge::new(b"cold", &policy, 1)).await;
    assert!(err.unwrap_err().is_unavailable());
    assert_eq!(
        store.local_units(b"hot"),
        0,
        "the lease ended with the store"
    );
}

#[tokio::test]
async fn lockout_charges_are_never_leased() {
    let clock = ManualClock::starting_at(3_600 * S);
    let inner = shared(&clock);
    let store = leasing(inner.clone(), &clock);
    let policy = Policy::fixed_window(100, Duration::from_secs(1)).unwrap();
    for _ in 0..10 {
        let c = Charge::new(b"strikes", &policy, 1).of_penalty();
        store.check(c).await.unwrap();
    }
    assert_eq!(inner.checks(), 10);
    assert_eq!(store.local_units(b"strikes"), 0);
}
