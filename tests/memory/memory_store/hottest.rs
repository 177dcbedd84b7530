//! The hottest keys of a memory store: exact with no sampling, bounded,
//! over the last interval and the one under way, on every check path.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::{Charge, Store};
use tower_throttle::{MemoryStore, Policy};

use super::all_policies;

/// A memory store's future, which is ready when first polled.
fn at_once<F: std::future::Future>(future: F) -> F::Output {
    let waker = std::task::Waker::noop();
    match std::pin::pin!(future).poll(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("the memory store waited"),
    }
}

fn tracked(clock: &ManualClock, capacity: usize, sample: u32) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .track_hottest_keys(capacity, Duration::from_secs(60))
        .sample_hottest_keys(sample)
        .build()
}

fn counts(list: &[tower_throttle::store::memory::KeyActivity]) -> Vec<(String, u64)> {
    list.iter()
        .map(|k| (String::from_utf8_lossy(&k.key).into_owned(), k.count))
        .collect()
}

#[test]
fn an_untracked_store_reports_nothing() {
    let store = MemoryStore::new();
    assert_eq!(store.hottest_keys(10), None);
}

#[test]
fn every_policy_and_path_counts_checks_and_denials_exactly() {
    for (name, policy) in all_policies() {
        let clock = ManualClock::new();
        let store = tracked(&clock, 16, 1);
        // 20 checks of a (limit 15: 5 or more denied), 3 of b, through
        // check_sync, one `decide` and the async trait path.
        for i in 0..20 {
            let charge = Charge::new(b"a", &policy, 1);
            match i % 3 {
                0 => drop(store.check_sync(charge).unwrap()),
                1 => drop(store.decide(&[charge]).ready().unwrap().unwrap()),
                _ => drop(at_once(store.check(charge)).unwrap()),
            }
        }
        for _ in 0..3 {
            store.check_sync(Charge::new(b"b", &policy, 1)).unwrap();
        }
        // Peeks and lock-out state are not checks.
        store.check_sync(Charge::new(b"b", &policy, 0)).unwrap();
        store
            .check_sync(Charge::new(b"strikes", &policy, 1).of_penalty())
            .unwrap();

        let hottest = store.hottest_keys(10).unwrap();
        assert_eq!(
            counts(&hottest.by_checks),
            [("a".into(), 20), ("b".into(), 3)],
            "{name}"
        );
        let denied = counts(&hottest.by_denials);
        assert_eq!(denied.len(), 1, "{name}: {denied:?}");
        assert_eq!(denied[0].0, "a", "{name}");
        assert!(denied[0].1 >= 5, "{name}: {denied:?}");
        assert_eq!(
            (hottest.checks, hottest.denials),
            (23, denied[0].1),
            "{name}"
        );
        assert!(hottest.by_checks.iter().all(|k| k.error == 0), "{name}");
    }
}

#[test]
fn a_hot_gcra_key_is_counted_on_the_lock_free_lane_too() {
    let clock = ManualClock::new();
    let store = tracked(&clock, 8, 1);
    let policy = Policy::cell(1_000_000, 1_000_000, Duration::from_secs(1)).unwrap();
    // One thread checking one key again and again promotes it to a cell
    // that thread decides without a lock.
    for _ in 0..5_000 {
        let admitted = store.decide(&[Charge::new(b"hot", &policy, 1)]).ready();
        assert!(admitted.unwrap().unwrap()[0].allowed);
    }
    let hottest = store.hottest_keys(1).unwrap();
    assert_eq!(counts(&hottest.by_checks), [("hot".into(), 5_000)]);
}

#[test]
fn multi_rule_checks_count_each_rule_and_the_rules_that_denied() {
    let clock = ManualClock::new();
    let store = tracked(&clock, 8, 1);
    let tight = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let loose = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
    for _ in 0..3 {
        store
            .check_all_sync(&[
                Charge::new(b"tight", &tight, 1),
                Charge::new(b"loose", &loose, 1),
            ])
            .unwrap();
    }
    let hottest = store.hottest_keys(10).unwrap();
    assert_eq!(
        counts(&hottest.by_checks),
        [("loose".into(), 3), ("tight".into(), 3)]
    );
    assert_eq!(counts(&hottest.by_denials), [("tight".into(), 2)]);
}

#[test]
fn counts_cover_the_last_interval_and_the_one_under_way() {
    let clock = ManualClock::new();
    let store = tracked(&clock, 8, 1);
    let policy = Policy::fixed_window(1_000, Duration::from_secs(1)).unwrap();
    let check = |key: &[u8], n: usize| {
        for _ in 0..n {
            store.check_sync(Charge::new(key, &policy, 1)).unwrap();
        }
    };
    check(b"old", 10);
    clock.advance(Duration::from_secs(60));
    check(b"new", 4);
    let both = store.hottest_keys(10).unwrap();
    assert_eq!(
        counts(&both.by_checks),
        [("old".into(), 10), ("new".into(), 4)]
    );
    assert_eq!(both.span, Duration::from_secs(60));

    clock.advance(Duration::from_secs(60));
    let last = store.hottest_keys(10).unwrap();
    assert_eq!(counts(&last.by_checks), [("new".into(), 4)]);
    assert_eq!(last.span, Duration::from_secs(60));

    // Two whole intervals without a check forget everything.
    clock.advance(Duration::from_secs(121));
    let none = store.hottest_keys(10).unwrap();
    assert_eq!((none.checks, none.denials), (0, 0));
    assert!(none.by_checks.is_empty() && none.by_denials.is_empty());
}

#[test]
fn sampling_counts_one_check_in_n_n_times() {
    let clock = ManualClock::new();
    let store = tracked(&clock, 8, 4);
    let policy = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
    for _ in 0..400 {
        store.check_sync(Charge::new(b"k", &policy, 1)).unwrap();
    }
    let hottest = store.hottest_keys(1).unwrap();
    assert_eq!(counts(&hottest.by_checks), [("k".into(), 400)]);
}

#[test]
fn a_flood_of_distinct_keys_stays_bounded_and_keeps_the_heavy_key() {
    let clock = ManualClock::new();
    let store = tracked(&clock, 4, 1);
    let policy = Policy::fixed_window(1_000_000, Duration::from_secs(60)).unwrap();
    for i in 0..10_000u32 {
        store
            .check_sync(Charge::new(format!("flood-{i}").as_bytes(), &policy, 1))
            .unwrap();
        // A third of all checks: more than total / capacity.
        if i % 2 == 0 {
            store.check_sync(Charge::new(b"heavy", &policy, 1)).unwrap();
        }
    }
    let hottest = store.hottest_keys(usize::MAX).unwrap();
    assert!(hottest.by_checks.len() <= 4, "{}", hottest.by_checks.len());
    let heavy = &hottest.by_checks[0];
    assert_eq!(&*heavy.key, b"heavy");
    // Never below the true count, and at most `error` above it.
    assert!(
        heavy.count >= 5_000 && heavy.count - heavy.error <= 5_000,
        "{heavy:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Space-Saving's guarantees, on any stream: every count is an upper
    /// bound at most `error` above the truth, and every key with more than
    /// total / capacity of the checks is listed.
    #[test]
    fn counts_bound_the_truth_and_keep_every_frequent_key(
        stream in prop::collection::vec(0u8..40, 1..600),
        capacity in 1usize..12,
    ) {
        let clock = ManualClock::new();
        let store = tracked(&clock, capacity, 1);
        let policy = Policy::fixed_window(1_000_000, Duration::from_secs(60)).unwrap();
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        for k in &stream {
            let key = vec![b'k', *k];
            store.check_sync(Charge::new(&key, &policy, 1)).unwrap();
            *truth.entry(key).or_default() += 1;
        }
        let hottest = store.hottest_keys(usize::MAX).unwrap();
        prop_assert!(hottest.by_checks.len() <= capacity);
        for k in &hottest.by_checks {
            let t = truth[&*k.key];
            prop_assert!(k.count >= t && k.count - k.error <= t, "{:?} true {}", k, t);
        }
        let total = stream.len() as u64;
        for (key, &t) in &truth {
            if t * capacity as u64 > total {
                prop_assert!(hottest.by_checks.iter().any(|k| *k.key == **key), "{:?}", key);
            }
        }
    }
}
