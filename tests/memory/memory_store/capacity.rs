//! Duplicate keys refused; a flood of keys under the cap; cold keys swept, asked or not.

use std::time::Duration;

use super::{all_policies, manual_store};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, StoreError};

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
