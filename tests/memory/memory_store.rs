//! The memory store's promises: redis-cell's literal replies, exact bounds
//! under concurrency, bounded memory, cold keys swept, clock faults.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, MemoryStore, Policy, StoreError};

mod flood;
mod full;
mod hottest;

fn manual_store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn all_policies() -> Vec<(&'static str, Policy)> {
    let minute = Duration::from_secs(60);
    vec![
        ("cell", Policy::cell(14, 30, minute).unwrap()),
        ("funnel", Policy::funnel(15, 0.5).unwrap()),
        ("token_bucket", Policy::token_bucket(15, 0.5).unwrap()),
        ("sliding_log", Policy::sliding_log(15, minute).unwrap()),
        ("fixed_window", Policy::fixed_window(15, minute).unwrap()),
        (
            "sliding_window",
            Policy::sliding_window(15, minute).unwrap(),
        ),
        ("concurrency", Policy::concurrency(15).unwrap()),
    ]
}

#[test]
fn cl_throttle_literal_replies() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let policy = Policy::cell(15, 30, Duration::from_secs(60)).unwrap();
    let check = || {
        store
            .check_sync(Charge::new(b"user123", &policy, 1))
            .unwrap()
            .to_cell_reply()
    };
    assert_eq!(check(), [0, 16, 15, -1, 2]);
    for _ in 1..16 {
        assert_eq!(check()[0], 0);
    }
    assert_eq!(check(), [1, 16, 0, 2, 32]);
    // 1.5 s later one unit has not yet come back: retry in 0.5 s, rounded up.
    clock.advance(Duration::from_millis(1500));
    assert_eq!(check(), [1, 16, 0, 1, 31]);
    clock.advance(Duration::from_millis(500));
    assert_eq!(check(), [0, 16, 0, -1, 32]);
    // A quantity above the limit can never pass: redis-cell answers -1.
    let d = store
        .check_sync(Charge::new(b"user123", &policy, 17))
        .unwrap();
    assert!(d.is_never());
    assert_eq!(d.to_cell_reply(), [1, 16, 0, -1, 32]);
}

/// N threads on one key with time frozen admit exactly the limit, for every algorithm.
#[test]
fn threads_hammering_one_key_admit_exactly_the_bound() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 10_000;
    for (name, policy) in all_policies() {
        let clock = ManualClock::new();
        let store = manual_store(&clock);
        let admitted = Arc::new(AtomicU64::new(0));
        let start = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (store, admitted, start) = (store.clone(), admitted.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..PER_THREAD {
                        let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                        admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 15, "{name}");
    }
}

/// With time moving, admissions never exceed what the model allows for the
/// elapsed time: GCRA admits limit + elapsed/T at most.
#[test]
fn threads_with_advancing_time_never_exceed_the_rate() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let policy = Policy::cell(4, 10, Duration::from_secs(1)).unwrap(); // T = 100 ms, limit 5
    let admitted = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let (store, admitted, clock) = (store.clone(), admitted.clone(), clock.clone());
            std::thread::spawn(move || {
                for n in 0..5_000 {
                    if i == 0 && n % 50 == 0 {
                        clock.advance(Duration::from_millis(10));
                    }
                    let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                    admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // 100 advances of 10 ms = 1 s: at most 5 + 10 admissions.
    let got = admitted.load(Ordering::Relaxed);
    assert!(got <= 15, "admitted {got}");
    assert!(got >= 5, "admitted {got}");
}

#[test]
fn all_or_nothing_under_concurrency() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let minute = Policy::sliding_log(5, Duration::from_secs(60)).unwrap();
    let day = Policy::fixed_window(100, Duration::from_secs(86_400)).unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..1000)
                    .filter(|_| {
                        let rules = [
                            Charge::new(b"u:min", &minute, 1),
                            Charge::new(b"u:day", &day, 1),
                        ];
                        store
                            .check_all_sync(&rules)
                            .unwrap()
                            .iter()
                            .all(|d| d.allowed)
                    })
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 5);
    // The day rule was charged only for the 5 admitted requests.
    let d = store.check_sync(Charge::new(b"u:day", &day, 0)).unwrap();
    assert_eq!(d.remaining, 95);
}

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

#[test]
fn duplicate_keys_in_one_check_are_a_typed_error() {
    let store = MemoryStore::new();
    let p = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
    let err = store
        .check_all_sync(&[Charge::new(b"x", &p, 1), Charge::new(b"x", &p, 1)])
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err}");
}

#[test]
fn flood_of_distinct_keys_stays_under_the_cap() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(10_000)
        .evict_when_full(false)
        .overflow_buckets(1)
        .shards(16)
        .sweep_interval(None)
        .build();
    let policy = Policy::cell(0, 1, Duration::from_secs(60)).unwrap();
    let mut admitted = 0;
    for i in 0..100_000u32 {
        admitted += u32::from(
            store
                .check_sync(Charge::new(&i.to_le_bytes(), &policy, 1))
                .unwrap()
                .allowed,
        );
        assert!(store.len() <= 10_000);
    }
    // 10,000 keys of their own, then one admission of the shared overflow
    // state (1 a minute, and the clock stands still).
    assert_eq!(admitted, 10_001);
    assert_eq!(store.overflowed_checks(), 90_000);
    assert!(store.is_full());
    // Once the keys are cold, new keys fit again (swept on insert).
    clock.advance(Duration::from_secs(61));
    for i in 0..10_000u32 {
        let key = format!("new{i}");
        assert!(
            store
                .check_sync(Charge::new(key.as_bytes(), &policy, 1))
                .unwrap()
                .allowed
        );
    }
    assert!(store.len() <= 10_000);
}

#[test]
fn cold_keys_are_swept_and_memory_returns() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    for (name, policy) in all_policies() {
        for i in 0..1_000u32 {
            let key = format!("{name}{i}");
            store
                .check_sync(Charge::new(key.as_bytes(), &policy, 1))
                .unwrap();
        }
    }
    assert_eq!(store.len(), 7_000);
    assert_eq!(store.sweep(), 0, "nothing is cold yet");
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        store.sweep(),
        3_000,
        "GCRA keys (2 s) are cold; windows are not"
    );
    clock.advance(Duration::from_secs(121));
    store.sweep();
    assert!(store.is_empty(), "{} keys left", store.len());
}

#[test]
fn janitor_thread_sweeps_without_being_asked() {
    let store = MemoryStore::builder()
        .sweep_interval(Some(Duration::from_millis(20)))
        .build();
    let policy = Policy::cell(0, 1, Duration::from_millis(1)).unwrap();
    for i in 0..100u32 {
        store
            .check_sync(Charge::new(&i.to_le_bytes(), &policy, 1))
            .unwrap();
    }
    // Wall-clock on purpose: the janitor is a real thread on real time.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !store.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(store.is_empty());
}

#[test]
fn clock_jumping_backwards_never_admits_more() {
    for (name, policy) in all_policies() {
        let clock = ManualClock::starting_at(1_000_000_000_000);
        let store = manual_store(&clock);
        let mut admitted = 0;
        for step in 0..200u64 {
            // Forward 1 ms, then every 10th step back by 5 s (never below the start).
            if step % 10 == 9 {
                clock.set_ns(
                    clock
                        .now_ns()
                        .saturating_sub(5_000_000_000)
                        .max(1_000_000_000_000),
                );
            } else {
                clock.advance(Duration::from_millis(1));
            }
            admitted += u64::from(
                store
                    .check_sync(Charge::new(b"k", &policy, 1))
                    .unwrap()
                    .allowed,
            );
        }
        // At most 200 ms of forward motion: the burst plus what 0.2 s refills.
        assert!(admitted <= 15 + 1, "{name} admitted {admitted}");
        let _ = store
            .check_sync(Charge::new(b"k", &policy, u64::MAX))
            .unwrap();
    }
}

#[test]
fn stalled_clock_admits_only_the_burst() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    for (name, policy) in all_policies() {
        let key = name.as_bytes();
        let admitted = (0..1000)
            .filter(|_| {
                store
                    .check_sync(Charge::new(key, &policy, 1))
                    .unwrap()
                    .allowed
            })
            .count();
        assert_eq!(admitted, 15, "{name}");
    }
}

#[test]
fn huge_costs_and_extreme_times_do_not_panic() {
    for start in [0, 1, u64::MAX / 2, u64::MAX - 1] {
        let clock = ManualClock::starting_at(start);
        let store = manual_store(&clock);
        for (name, policy) in all_policies() {
            for cost in [0, 1, 15, 16, u64::MAX] {
                let d = store.check_sync(Charge::new(b"k", &policy, cost)).unwrap();
                if cost > 15 {
                    assert!(d.is_never(), "{name} cost {cost} at {start}: {d:?}");
                }
            }
            let forged = Receipt::new(u64::MAX, clock.now_ns(), None);
            store.refund_sync(b"k", &policy, &forged);
            clock.advance(Duration::MAX);
        }
    }
}

#[tokio::test]
async fn limiter_direct_api() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let reply = Limiter::new(
        store.clone(),
        Policy::sliding_log(5, Duration::from_secs(60)).unwrap(),
    )
    .with_prefix("reply");
    let mut receipts = Vec::new();
    for i in 0..5 {
        let d = reply.check("laoqian").await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 4 - i);
        receipts.extend(d.receipt());
    }
    assert!(!reply.check("laoqian").await.unwrap().allowed);
    assert!(
        reply.check("someone-else").await.unwrap().allowed,
        "keys are isolated"
    );
    let peek = reply.peek("laoqian").await.unwrap();
    assert!(peek.allowed, "a peek is never a denial");
    assert_eq!(peek.remaining, 0);
    for receipt in &receipts[..2] {
        reply.refund("laoqian", receipt).await.unwrap();
    }
    assert_eq!(reply.peek("laoqian").await.unwrap().remaining, 2);
    reply.reset("laoqian").await.unwrap();
    assert_eq!(reply.peek("laoqian").await.unwrap().remaining, 5);
    assert!(!reply.check_n("laoqian", 6).await.unwrap().allowed);
    // The prefix separates limiters sharing one store.
    let post = Limiter::new(
        store,
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .with_prefix("post");
    assert!(post.check("laoqian").await.unwrap().allowed);
}

#[tokio::test]
async fn permits_release_on_drop() {
    let limiter = Limiter::new(MemoryStore::new(), Policy::concurrency(2).unwrap());
    let a = limiter.acquire("upload").await.unwrap().unwrap();
    let b = limiter.acquire("upload").await.unwrap().unwrap();
    let denied = limiter.acquire("upload").await.unwrap().unwrap_err();
    assert!(!denied.allowed);
    drop(a);
    // One finishing holder frees exactly one permit (the @EntryTimes bug freed all).
    let c = limiter.acquire("upload").await.unwrap().unwrap();
    assert!(limiter.acquire("upload").await.unwrap().is_err());
    b.release().await.unwrap();
    drop(c);
    assert_eq!(limiter.peek("upload").await.unwrap().remaining, 2);
}

#[test]
fn lease_frees_a_permit_whose_holder_crashed() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let p = Policy::concurrency_with_lease(1, Duration::from_secs(30)).unwrap();
    assert!(store.check_sync(Charge::new(b"k", &p, 1)).unwrap().allowed);
    let d = store.check_sync(Charge::new(b"k", &p, 1)).unwrap();
    assert_eq!(d.retry_after, Some(Duration::from_secs(30)));
    clock.advance(Duration::from_secs(30));
    assert!(store.check_sync(Charge::new(b"k", &p, 1)).unwrap().allowed);
}
