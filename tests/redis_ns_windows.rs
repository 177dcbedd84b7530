//! Windows that are not a whole number of microseconds on Redis: decision by
//! decision the same as the memory store, with the clock moving in the
//! server clock's whole µs (issue 11). The scripts compute the window index
//! floor(1000·now / w) and the ns elapsed in it by exact long division.

#[path = "support/redis.rs"]
mod redis_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::{Decision, MemoryStore, PermitId, Policy, PolicyError, Rule, Store};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check(u64),
    Refund(u64),
    Reset,
    Release(usize),
}

/// Durations in ns that are not whole µs, from `min` to 2^49 − 1 ns, and
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

/// Ops on `policy`; the clock only moves forward. (A clock going back
/// after a key was deleted or pruned can revive state the memory store still
/// holds: a difference of both units, not of this one's arithmetic.)
fn with_ops(policy: Policy, span_us: u64) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let limit = policy.limit();
    let span = span_us.max(1);
    let op = prop_oneof![
        2 => (0..=span / 8).prop_map(Op::Advance),
        2 => (0..=span * 2).prop_map(Op::Advance),
        1 => (0..=3u64).prop_map(Op::Advance),
        8 => (0..=limit + 1).prop_map(Op::Check),
        1 => (1..=limit + 1).prop_map(Op::Refund),
        1 => Just(Op::Reset),
        2 => any::<usize>().prop_map(Op::Release),
    ];
    (Just(policy), proptest::collection::vec(op, 1..=30))
}

/// Policies of `f` with a window (lease) of at least `min` ns.
fn window(
    f: fn(u64, Duration) -> Result<Policy, PolicyError>,
    min: u64,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=6, odd_ns(min))
        // The Redis bound of a sliding window, (3·max + 2)·w ≤ 2^52 (a
        // fixed window's, w ≤ 2^49 ns, holds for every generated w).
        .prop_filter("beyond the exact range", |&(max, w)| {
            (3 * u128::from(max) + 2) * u128::from(w) <= 1 << 52
        })
        .prop_flat_map(move |(max, w)| with_ops(f(max, Duration::from_nanos(w)).unwrap(), w / 1000))
}

/// One Redis server, store and clock for all cases of a property.
struct Bench {
    _server: RedisServer,
    rt: tokio::runtime::Runtime,
    clock: ManualClock,
    redis: RedisStore,
    case: AtomicU64,
}

impl Bench {
    fn new() -> Bench {
        let server = RedisServer::start();
        let rt = runtime();
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = rt.block_on(async {
            RedisStore::builder()
                .prefix("t")
                .timeout(Duration::from_secs(5))
                .time_source(TimeSource::client(clock.clone()))
                // Real time passing never expires what the frozen clock holds.
                .ttl_padding(Duration::from_secs(600))
                .connect(server.url().as_str())
                .await
                .unwrap()
        });
        Bench {
            _server: server,
            rt,
            clock,
            redis,
            case: AtomicU64::new(0),
        }
    }

    fn run(&self, policy: Policy, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let key = format!("case-{}", self.case.fetch_add(1, Ordering::Relaxed));
        let key = key.as_bytes();
        let mem = MemoryStore::builder()
            .clock(self.clock.clone())
            .sweep_interval(None)
            .build();
        let (redis, clock) = (&self.redis, &self.clock);
        let strip = |d: Decision| Decision {
            permit: d.permit.map(|_| PermitId(0)),
            ..d
        };
        self.rt.block_on(async {
            let mut permits: Vec<(PermitId, PermitId)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Advance(n) => clock.advance(Duration::from_micros(n)),
                    Op::Check(cost) => {
                        let m = mem.check(Rule::new(key, &policy, cost)).await.unwrap();
                        let r = redis.check(Rule::new(key, &policy, cost)).await.unwrap();
                        prop_assert_eq!(strip(m), strip(r), "step {} cost {}", step, cost);
                        if let (Some(a), Some(b)) = (m.permit, r.permit) {
                            permits.push((a, b));
                        }
                    }
                    Op::Refund(n) => {
                        mem.refund(key, &policy, n).await.unwrap();
                        redis.refund(key, &policy, n).await.unwrap();
                    }
                    Op::Reset => {
                        mem.reset(key, &policy).await.unwrap();
                        redis.reset(key, &policy).await.unwrap();
                        permits.clear();
                    }
                    Op::Release(i) if !permits.is_empty() => {
                        let (a, b) = permits.remove(i % permits.len());
                        mem.release(key, &policy, a).await.unwrap();
                        redis.release(key, &policy, b).await.unwrap();
                    }
                    Op::Release(_) => {}
                }
            }
            Ok(())
        })
    }
}

macro_rules! model_test {
    ($name:ident, $strategy:expr) => {
        #[test]
        fn $name() {
            let bench = Bench::new();
            let config = ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            };
            proptest!(config, |((policy, ops) in $strategy)| {
                bench.run(policy, ops)?;
            });
        }
    };
}

model_test!(
    fixed_window_in_ns_matches_memory_store,
    window(Policy::fixed_window, 1001)
);
model_test!(
    sliding_window_in_ns_matches_memory_store,
    window(Policy::sliding_window, 1001)
);
model_test!(
    sliding_log_in_ns_matches_memory_store,
    window(Policy::sliding_log, 1)
);
model_test!(
    concurrency_with_a_lease_in_ns_matches_memory_store,
    window(Policy::concurrency_with_lease, 1)
);

/// Logs and leases that are not whole µs beyond 2^49 ns, up to a year
/// and a day: the scripts take the duration's exact (µs, ns) pair from its
/// digits. Each case starts at the same instant (fresh keys), so that the
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

macro_rules! long_model_test {
    ($name:ident, $strategy:expr) => {
        #[test]
        fn $name() {
            let bench = Bench::new();
            let config = ProptestConfig {
                cases: 64,
                failure_persistence: None,
                ..ProptestConfig::default()
            };
            proptest!(config, |((policy, ops) in $strategy)| {
                bench.clock.set_ns(1_700_000_000_000_000_000);
                bench.run(policy, ops)?;
            });
        }
    };
}

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
                tokio::spawn(async move { store.check(Rule::new(&key, &policy, 1)).await.unwrap() })
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
    let strip = |d: Decision| Decision {
        permit: d.permit.map(|_| PermitId(0)),
        ..d
    };
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
        let rules: Vec<Rule<'_>> = small
            .iter()
            .zip(&keys)
            .map(|(p, k)| Rule::new(k, p, step % 3))
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
/// remainder, are exact up to the scripts' clock bound (2^52 µs) and for
/// windows up to 2^49 ns: a fresh key's reset_after is (index + 1)·w − now,
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
    let windows_ns = [1_001, 1_500, 333_333_333, 999_999_999_999, (1 << 49) - 1];
    for now in nows_us {
        for w in windows_ns {
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
