//! redis-cell's literal replies and exact bounds with threads on one key, all-or-nothing included.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::{all_policies, manual_store};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::Policy;

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
