//! A flood of distinct keys stays under the store's cap in bounded work.

use std::time::{Duration, Instant};

use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

// ----------------------------------------------------------------- flood ---

/// The CPU time the calling thread has run, where Linux reports it
/// (`/proc/thread-self/schedstat`, in ns): unlike wall time, it does not
/// grow while other processes have the machine's cores.
fn thread_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[test]
fn a_million_distinct_keys_stay_under_the_cap() {
    const CAP: usize = 5_000;
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(CAP)
        .evict_when_full(false)
        .overflow_buckets(1)
        .shards(16)
        .sweep_interval(None)
        .build();
    let policy = Policy::cell(4, 1, Duration::from_secs(60)).unwrap();
    let t0 = Instant::now();
    let cpu0 = thread_cpu_time();
    let mut admitted = 0u64;
    for i in 0..1_000_000u32 {
        // Time creeps forward: 1 µs per request, so nothing goes cold (τ = 5 min).
        if i % 1000 == 0 {
            clock.advance(Duration::from_millis(1));
            assert!(store.len() <= CAP, "{} keys at {i}", store.len());
        }
        let d = store
            .check_sync(Charge::new(&i.to_le_bytes(), &policy, 1))
            .unwrap();
        admitted += u64::from(d.allowed);
    }
    let took = t0.elapsed();
    let cpu = cpu0.zip(thread_cpu_time()).map(|(a, b)| b - a);
    println!(
        "1,000,000 distinct keys: {admitted} admitted, {} decided in overflow, {} held, \
         {took:?} ({cpu:?} of CPU)",
        store.overflowed_checks(),
        store.len()
    );
    // The keys that fit, then the shared overflow state's burst of 5 (it
    // earns one more a minute; the flood lasts a second of the manual clock).
    assert_eq!(store.len(), CAP);
    assert_eq!(store.overflowed_checks(), 1_000_000 - CAP as u64);
    assert_eq!(admitted as usize, CAP + 5);
    // Live keys are never evicted: the first key is still limited.
    let d = store
        .check_sync(Charge::new(&0u32.to_le_bytes(), &policy, 5))
        .unwrap();
    assert!(!d.allowed, "a live key lost its state");
    // A bound on the work, not on the machine: CPU time, which a loaded
    // machine does not stretch as it does wall time (no bound where the
    // platform does not report it).
    if let Some(cpu) = cpu {
        assert!(
            cpu < Duration::from_secs(30),
            "{cpu:?} of CPU ({took:?} wall)"
        );
    }
}

/// The same flood on a store that evicts (`evict_when_full`): every key beyond
/// the cap takes the room of the least used one, so the store stays at its
/// cap and a key at its limit is never the one evicted; the work stays
/// bounded (CPU time, not wall time).
#[test]
fn a_flood_on_an_evicting_store_stays_under_the_cap_in_bounded_work() {
    const CAP: usize = 5_000;
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(CAP)
        .shards(16)
        .sweep_interval(None)
        .evict_when_full(true)
        .build();
    let policy = Policy::cell(4, 1, Duration::from_secs(60)).unwrap();
    // A spammer spends its burst first.
    let spammer = b"spammer";
    while store
        .check_sync(Charge::new(spammer, &policy, 1))
        .unwrap()
        .allowed
    {}
    let cpu0 = thread_cpu_time();
    for i in 0..200_000u32 {
        if i % 1000 == 0 {
            clock.advance(Duration::from_millis(1));
            assert!(store.len() <= CAP, "{} keys at {i}", store.len());
        }
        let d = store
            .check_sync(Charge::new(&i.to_le_bytes(), &policy, 1))
            .unwrap();
        assert!(d.allowed, "key {i}: a new key beyond the cap was refused");
    }
    let cpu = cpu0.zip(thread_cpu_time()).map(|(a, b)| b - a);
    assert_eq!(store.len(), CAP);
    assert!(store.evicted_keys() >= 190_000, "{}", store.evicted_keys());
    let d = store.check_sync(Charge::new(spammer, &policy, 1)).unwrap();
    assert!(!d.allowed, "the spammer at its limit was evicted");
    if let Some(cpu) = cpu {
        assert!(cpu < Duration::from_secs(30), "{cpu:?} of CPU");
    }
}
