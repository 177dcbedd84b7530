//! Hot keys decided lock-free through a thread cache, against sweeps, resets and multi-rule checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::manual_store;
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

// ------------------------------------------------------------ hot keys ---
// A GCRA key one thread keeps checking is decided lock-free through a
// thread cache (src/store/memory/hot.rs). These tests pit that path against
// everything that takes a key out of the map or must exclude it.

/// Multi-rule checks stay all-or-nothing while other threads hammer one of
/// their keys through the lock-free path: the hot key is charged exactly
/// once per admission, by either kind of check.
#[test]
fn multi_rule_checks_stay_atomic_against_a_hot_key() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let hot = Policy::cell(299, 1, Duration::from_secs(3600)).unwrap(); // 300 at once
    let pair = Policy::fixed_window(10_000, Duration::from_secs(86_400)).unwrap();
    // Each round races the hot key to its bound from both sides (the pair
    // rule never binds): the boundary is where a cached admission slipping
    // between a multi-rule check's decision and its commit would show.
    for round in 0..20 {
        let (hot_key, pair_key) = (format!("hot{round}"), format!("pair{round}"));
        let start = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let (store, start) = (store.clone(), start.clone());
                let (hot_key, pair_key) = (hot_key.clone(), pair_key.clone());
                std::thread::spawn(move || {
                    start.wait();
                    let (mut single, mut multi) = (0u64, 0u64);
                    for _ in 0..1_000 {
                        let h = Charge::new(hot_key.as_bytes(), &hot, 1);
                        if t % 2 == 0 {
                            single += u64::from(store.check_sync(h).unwrap().allowed);
                        } else {
                            let rules = [h, Charge::new(pair_key.as_bytes(), &pair, 1)];
                            let d = store.check_all_sync(&rules).unwrap();
                            multi += u64::from(d.iter().all(|d| d.allowed));
                        }
                    }
                    (single, multi)
                })
            })
            .collect();
        let (single, multi) = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert_eq!(single + multi, 300, "round {round}: {single} + {multi}");
        let peek = store
            .check_sync(Charge::new(pair_key.as_bytes(), &pair, 0))
            .unwrap();
        assert_eq!(
            peek.remaining,
            10_000 - multi,
            "round {round}: pair charged once per admission"
        );
    }
}

/// A hot key swept while a thread still caches it: the sweep takes it only
/// once it is cold, and the thread's next checks see the key afresh.
#[test]
fn sweeping_a_cached_hot_key_loses_nothing() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    // 10 at once, one more every 10 s: cold 100 s after the burst.
    let p = Policy::cell(9, 1, Duration::from_secs(10)).unwrap();
    let check = || store.check_sync(Charge::new(b"k", &p, 1)).unwrap().allowed;
    assert_eq!((0..20).filter(|_| check()).count(), 10);
    // Still warm: a sweep keeps it, and it stays exhausted.
    assert_eq!(store.sweep(), 0);
    assert!(!check());
    clock.advance(Duration::from_secs(99));
    assert_eq!(store.sweep(), 0, "one second from cold");
    clock.advance(Duration::from_secs(1));
    assert_eq!(store.sweep(), 1);
    assert_eq!(store.len(), 0);
    // The cache's cell is retired: the key starts over in the map, exactly.
    assert_eq!((0..20).filter(|_| check()).count(), 10);
    assert_eq!(store.len(), 1);
}

/// Sweeps racing cached admissions at the very instant a hot key goes cold:
/// either the sweep retires the cell first (and the key starts over in the
/// map) or an admission lands first (and the sweep keeps it) — never both,
/// so exactly one fresh burst is admitted.
#[test]
fn sweeps_racing_cached_admissions_lose_nothing() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    // 10 at once, one more every 10 s.
    let p = Policy::cell(9, 1, Duration::from_secs(10)).unwrap();
    for round in 0..20u64 {
        let key = format!("k{round}");
        // Four hammering threads, the sweeper and this one.
        let start = Arc::new(Barrier::new(6));
        let done = Arc::new(AtomicU64::new(0));
        // Promote the key in every hammering thread and exhaust it.
        let hammer: Vec<_> = (0..4)
            .map(|_| {
                let (store, start, key) = (store.clone(), start.clone(), key.clone());
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        store
                            .check_sync(Charge::new(key.as_bytes(), &p, 1))
                            .unwrap();
                    }
                    start.wait(); // the clock moves to the key's expiry
                    start.wait();
                    (0..2_000)
                        .filter(|_| {
                            store
                                .check_sync(Charge::new(key.as_bytes(), &p, 1))
                                .unwrap()
                                .allowed
                        })
                        .count() as u64
                })
            })
            .collect();
        let sweeper = {
            let (store, start, done) = (store.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                start.wait();
                start.wait();
                let mut swept = 0;
                for _ in 0..100_000 {
                    swept += store.sweep();
                    if done.load(Ordering::Acquire) == 4 {
                        break;
                    }
                }
                swept
            })
        };
        start.wait();
        // Every thread exhausted the key: it is cold exactly 100 s later.
        clock.advance(Duration::from_secs(100));
        start.wait();
        let admitted: u64 = hammer
            .into_iter()
            .map(|h| {
                let n = h.join().unwrap();
                done.fetch_add(1, Ordering::Release);
                n
            })
            .sum();
        sweeper.join().unwrap();
        assert_eq!(admitted, 10, "round {round}: one fresh burst, exactly");
        // Whatever the sweeps did, the key's state is the one burst.
        let peek = store
            .check_sync(Charge::new(key.as_bytes(), &p, 0))
            .unwrap();
        assert_eq!(peek.remaining, 0, "round {round}");
    }
}

/// Reset and refund reach a key that a thread decides through its cache.
#[test]
fn reset_and_refund_reach_a_cached_hot_key() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let p = Policy::cell(4, 1, Duration::from_secs(60)).unwrap(); // 5 at once
    let admitted = |n| -> Vec<Receipt> {
        (0..n)
            .filter_map(|_| {
                store
                    .check_sync(Charge::new(b"k", &p, 1))
                    .unwrap()
                    .receipt()
            })
            .collect()
    };
    let receipts = admitted(10);
    assert_eq!(receipts.len(), 5);
    let (a, b) = (receipts[3], receipts[4]);
    store.refund_sync(b"k", &p, &a);
    store.refund_sync(b"k", &p, &b);
    assert_eq!(admitted(10).len(), 2, "exactly the refund");
    store.reset_sync(b"k");
    assert_eq!(admitted(10).len(), 5, "a fresh key after reset");
}

/// Many threads promote one key at once and keep deciding it lock-free
/// while the clock moves: exactly the burst plus one per interval.
#[test]
fn a_hot_key_shared_by_threads_admits_exactly_the_bound() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let p = Policy::cell(99, 10, Duration::from_secs(1)).unwrap(); // 100 at once, 10/s
    let start = Arc::new(Barrier::new(8));
    let admitted = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (store, start, admitted, clock) = (
                store.clone(),
                start.clone(),
                admitted.clone(),
                clock.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for i in 0..5_000 {
                    // After the burst is spent (thread 0 alone checks 499
                    // times first), ten advances of one interval each; each
                    // is followed by thread 0's own check.
                    if t == 0 && i % 500 == 499 {
                        clock.advance(Duration::from_millis(100));
                    }
                    if store
                        .check_sync(Charge::new(b"global", &p, 1))
                        .unwrap()
                        .allowed
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 110);
    let peek = store.check_sync(Charge::new(b"global", &p, 0)).unwrap();
    assert_eq!(peek.remaining, 0, "{peek:?}");
}

/// A multi-rule check whose room-making sweep removes one of its own cold
/// keys puts it back and counts it: the key cap still holds afterwards.
#[test]
fn a_multi_rule_check_counts_a_cold_key_it_brings_back() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .shards(1)
        .max_keys(2)
        .evict_when_full(false)
        .overflow_buckets(1)
        .build();
    let p = Policy::cell(4, 1, Duration::from_secs(1)).unwrap();
    for key in [&b"a"[..], b"c"] {
        assert!(store.check_sync(Charge::new(key, &p, 1)).unwrap().allowed);
    }
    clock.advance(Duration::from_secs(2)); // a and c are cold, not yet swept
    let rules = [Charge::new(b"a", &p, 1), Charge::new(b"b", &p, 1)];
    assert!(store
        .check_all_sync(&rules)
        .unwrap()
        .iter()
        .all(|d| d.allowed));
    assert_eq!(store.len(), 2);
    // a and b are live: a third key does not fit, and is decided in overflow.
    assert!(store.check_sync(Charge::new(b"d", &p, 1)).unwrap().allowed);
    assert_eq!(store.len(), 2);
    assert_eq!(store.overflowed_checks(), 1);
}
