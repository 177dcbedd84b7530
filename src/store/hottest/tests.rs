//! The wrapper counts every decided check once, whatever path decided it,
//! and its report reads right: exact counts bare, others with the bounds
//! the summary vouches for.

use std::time::Duration;

use super::Hottest;
use crate::clock::ManualClock;
use crate::store::{AtOnce, Charge, MemoryStore, Store};
use crate::Policy;

fn tracked(capacity: usize) -> Hottest<MemoryStore<ManualClock>, ManualClock> {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Hottest::new(store, capacity, Duration::from_secs(60)).clock(clock)
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn every_path_counts_once_and_peeks_and_penalties_not_at_all() {
    let store = tracked(16);
    let p = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let q = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
    let a = Charge::new(b"a", &p, 1);
    block_on(async {
        store.check(a).await.unwrap();
        store
            .check_all(&[a, Charge::new(b"b", &q, 1)])
            .await
            .unwrap();
    });
    store.at_once(a).unwrap().unwrap();
    // The fourth check of `a` is denied, whichever path asks.
    store.at_once(a).unwrap().unwrap();
    store.all_at_once(&[a]).unwrap().unwrap();
    store.at_once(Charge::new(b"a", &p, 0)).unwrap().unwrap();
    store
        .at_once(Charge::new(b"s", &p, 1).of_penalty())
        .unwrap()
        .unwrap();

    let report = store.hottest_keys(10);
    let shown: Vec<String> = report.by_checks.iter().map(|k| k.to_string()).collect();
    assert_eq!(shown, ["a  5", "b  1"]);
    assert_eq!((report.checks, report.denials), (6, 2));
    assert_eq!(report.by_denials[0].to_string(), "a  2");
    assert!(report.by_checks.iter().all(|k| k.is_exact()));
}

/// The report: after 5,000 users of one check each, the keys
/// listed had inherited their counts. Each reads as at least 1 and at
/// most its count, never as a bare count.
#[test]
fn keys_that_inherited_their_counts_show_their_bounds() {
    let store = tracked(41);
    let p = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    for user in 0..5_000 {
        let key = format!("api:default:u-{user}");
        store
            .at_once(Charge::new(key.as_bytes(), &p, 1))
            .unwrap()
            .unwrap();
    }
    let report = store.hottest_keys(10);
    assert_eq!(report.checks, 5_000);
    assert_eq!(report.by_checks.len(), 10);
    for k in &report.by_checks {
        assert!(!k.is_exact() && k.count > 1, "{k}");
        assert_eq!(k.lower_bound, 1, "each user checked once: {k}");
        let bounds = format!("≥ 1, ≤ {}", k.count);
        assert_eq!(k.count_display().to_string(), bounds);
        assert!(k.to_string().ends_with(&bounds), "{k}");
    }
    let table = report.to_string();
    assert!(
        table.starts_with("over 0.0ns: 5000 checks, 0 denials\nby checks:\n  api:default:u-"),
        "{table}"
    );
    assert!(table.ends_with("by denials: none"), "{table}");
}

#[test]
fn a_hot_key_stays_exact_among_cold_ones_and_sampling_is_shown() {
    let store = tracked(8);
    let p = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
    for i in 0..200 {
        store.at_once(Charge::new(b"hot", &p, 1)).unwrap().unwrap();
        let cold = format!("cold-{i}");
        store
            .at_once(Charge::new(cold.as_bytes(), &p, 1))
            .unwrap()
            .unwrap();
    }
    let top = &store.hottest_keys(1).by_checks[0];
    assert_eq!(
        (&*top.key, top.count, top.is_exact()),
        (&b"hot"[..], 200, true)
    );

    let sampled = tracked(8).sample_every(4);
    for _ in 0..400 {
        sampled.at_once(Charge::new(b"k", &p, 1)).unwrap().unwrap();
    }
    let report = sampled.hottest_keys(1);
    assert_eq!((report.checks, report.sample_every), (400, 4));
    assert_eq!(report.by_checks[0].to_string(), "k  ≈ 400");
    assert!(report.to_string().contains("one check in 4 counted"));
}
