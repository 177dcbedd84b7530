//! Windows that are not a whole number of microseconds on Redis: decision by
//! decision the same as the memory store, with the clock moving in the
//! server clock's whole µs (issue 11). The scripts compute the window index
//! floor(1000·now / w) and the ns elapsed in it exactly (`win_divmod`).

use crate::model_bench;
use crate::redis_support;

use std::time::Duration;

use model_bench::{with_ops, Bench, Op};
use proptest::prelude::*;
use redis_support::RedisServer;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, PolicyError, Store};

/// Durations in ns that are not whole µs, from `min` ns to 3 s, and
/// the thirds and sevenths of common periods.
fn odd_ns(min: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (min..=3_000_000_000).prop_map(|n| if n % 1000 == 0 { n + 1 } else { n }),
        1 => (min..=2_000).prop_map(|n| if n % 1000 == 0 { n + 1 } else { n }),
        1 => prop_oneof![
            Just(1_001u64),
            Just(1_500),
            Just(333_333_333),
            Just(8_571_428_571), // a minute / 7
            Just(28_800_000_000_001),
            Just((1 << 49) - 1),
        ],
    ]
}

/// Policies of `f` with a window (lease) of at least `min` ns.
fn window(
    f: fn(u64, Duration) -> Result<Policy, PolicyError>,
    min: u64,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=6, odd_ns(min))
        .prop_flat_map(move |(max, w)| with_ops(f(max, Duration::from_nanos(w)).unwrap(), w / 1000))
}

model_test!(
    fixed_window_in_ns_matches_memory_store,
    window(Policy::fixed_window, 1)
);
model_test!(
    sliding_window_in_ns_matches_memory_store,
    window(Policy::sliding_window, 1)
);
model_test!(
    sliding_log_in_ns_matches_memory_store,
    window(Policy::sliding_log, 1)
);
model_test!(
    concurrency_with_a_lease_in_ns_matches_memory_store,
    window(Policy::concurrency_with_lease, 1)
);

/// Windows, logs and leases that are not whole µs beyond 2^49 ns, up to a
/// year and a day: the scripts take the duration's exact (µs, ns) pair from
/// its digits (and windows divide by it, estimate then correct). Each case starts at the same instant (fresh keys), so that the
/// long advances stay below the clock bound.
fn long_window(
    f: fn(u64, Duration) -> Result<Policy, PolicyError>,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let year = 366 * 86_400 * 1_000_000_000u64;
    let odd = prop_oneof![
        4 => ((1u64 << 49)..=year).prop_map(|n| if n % 1000 == 0 { n + 1 } else { n }),
        1 => Just((1u64 << 53) + 1),
        1 => Just(year - 1),
        1 => Just(365 * 86_400 * 1_000_000_000 / 7 + 1),
    ];
    (1u64..=6, odd)
        .prop_flat_map(move |(max, w)| with_ops(f(max, Duration::from_nanos(w)).unwrap(), w / 1000))
}

long_model_test!(
    fixed_window_up_to_a_year_in_ns_matches_memory_store,
    long_window(Policy::fixed_window)
);
long_model_test!(
    sliding_window_up_to_a_year_in_ns_matches_memory_store,
    long_window(Policy::sliding_window)
);
long_model_test!(
    sliding_log_up_to_a_year_in_ns_matches_memory_store,
    long_window(Policy::sliding_log)
);
long_model_test!(
    concurrency_with_a_lease_up_to_a_year_in_ns_matches_memory_store,
    long_window(Policy::concurrency_with_lease)
);

/// Concurrent callers share batches (the uniform fast path for windows and
/// logs, the general one for leases and mixed checks): each admission sees
/// every earlier one, and a multi-rule check of all four algorithms in ns
/// decides as the memory store does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_and_multi_rule_checks_in_ns_match_memory() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = std::sync::Arc::new(
        RedisStore::builder()
            .prefix("b")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(frozen.clone()))
            .ttl_padding(Duration::from_secs(600))
            .deny_cache(0)
            .connect(server.url().as_str())
            .await
            .unwrap(),
    );
    let bound = 25;
    let third = Duration::from_nanos(333_333_333);
    let policies = [
        Policy::fixed_window(bound, third).unwrap(),
        Policy::sliding_window(bound, third).unwrap(),
        Policy::sliding_log(bound, third).unwrap(),
        Policy::concurrency_with_lease(bound, third).unwrap(),
    ];
    for (i, policy) in policies.into_iter().enumerate() {
        let key = format!("batch{i}").into_bytes();
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(
                    async move { store.check(Charge::new(&key, &policy, 1)).await.unwrap() },
                )
            })
            .collect();
        let mut remaining = Vec::new();
        for t in tasks {
            let d = t.await.unwrap();
            if d.allowed {
                remaining.push(d.remaining);
            }
        }
        remaining.sort_unstable();
        assert_eq!(remaining, (0..bound).collect::<Vec<_>>(), "policy {i}");
    }
    let mem = MemoryStore::builder()
        .clock(frozen.clone())
        .sweep_interval(None)
        .build();
    let strip = model_bench::strip_permit;
    let keys: Vec<Vec<u8>> = (0..4).map(|i| format!("multi{i}").into_bytes()).collect();
    // Small limits, so that the walk reaches them.
    let small = [
        Policy::fixed_window(5, third).unwrap(),
        Policy::sliding_window(5, third).unwrap(),
        Policy::sliding_log(5, third).unwrap(),
        Policy::concurrency_with_lease(5, third).unwrap(),
    ];
    let mut denied = 0;
    for step in 0..40u64 {
        let rules: Vec<Charge<'_>> = small
            .iter()
            .zip(&keys)
            .map(|(p, k)| Charge::new(k, p, step % 3))
            .collect();
        let m = mem.check_all(&rules).await.unwrap();
        let r = store.check_all(&rules).await.unwrap();
        let (m, r): (Vec<_>, Vec<_>) = (
            m.into_iter().map(strip).collect(),
            r.into_iter().map(strip).collect(),
        );
        assert_eq!(m, r, "step {step}");
        denied += usize::from(m.iter().any(|d| !d.allowed));
        frozen.advance(Duration::from_micros(step * 7_919 % 50_000));
    }
    assert!(denied > 0, "the walk never reached a limit");
}

/// The window index and the time into it, floor(1000·now / w) and its
/// remainder, are exact up to the scripts' clock bound (2^52 µs) for
/// windows from 1 ns (indices past 2^53) to a year: a fresh key's reset_after is (index + 1)·w − now,
/// and a sliding window's admission depends on the remainder.
#[test]
fn window_division_is_exact_up_to_the_clock_bound() {
    let bench = Bench::new();
    let nows_us = [
        // Room for the advances (< 2^40 µs) below the bound.
        (1u64 << 52) - (1 << 40),
        (1 << 52) - (1 << 40) - 1_000_001,
        1_700_000_000_123_457,
        4_000_000_000_000_000,
        3_141_592_653_589_793,
    ];
    let windows_ns = [
        1,
        7,
        999,
        1_001,
        1_500,
        333_333_333,
        999_999_999_999,
        (1 << 49) - 1,
        (1 << 49) + 1,
        (1 << 53) + 1,
        365 * 86_400_000_000_000 - 1,
    ];
    for now in nows_us {
        for w in windows_ns {
            // Room for an advance of a window below the bound.
            let now = now.min((1 << 52) - w / 1000 - 2);
            bench.clock.set_ns(now * 1000);
            let ops = vec![Op::Check(1), Op::Advance(w / 2000), Op::Check(1)];
            let fixed = Policy::fixed_window(2, Duration::from_nanos(w)).unwrap();
            bench.run(fixed, ops.clone()).unwrap();
            // Two units in one window, then one more just past its end:
            // the previous window's weight is its remaining fraction.
            bench.clock.set_ns(now * 1000);
            let sliding = Policy::sliding_window(2, Duration::from_nanos(w)).unwrap();
            let ops = vec![Op::Check(2), Op::Advance(w / 1000 + 1), Op::Check(1)];
            bench.run(sliding, ops).unwrap();
        }
    }
}
