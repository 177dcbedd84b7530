//! Decision-by-decision agreement with the memory store (proptest models) and sliding-log bursts.

use crate::model_bench;
use crate::redis_support;

use std::time::Duration;

use super::{client_store, memory, us};
use model_bench::{with_ops, Bench, Op};
use proptest::prelude::*;
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

// ---------------------------------------------------------------- models ---

fn gcra() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (0u64..=5, 1u64..=3_000_000).prop_flat_map(|(burst, t)| {
        with_ops(Policy::cell(burst, 1, us(t)).unwrap(), t * (burst + 1))
    })
}

const YEAR: u64 = 365 * 86_400;

/// GCRA at intervals that are not whole microseconds: 3/s, 7/min, 7/day,
/// redis-cell's arguments with counts up to 10^6 and periods up to a year,
/// funnels at any rate.
fn gcra_ns() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let cell = (0u64..=5, 1u64..=1_000_000, 1u64..=YEAR)
        .prop_map(|(b, n, s)| Policy::cell(b, n, Duration::from_secs(s)).unwrap());
    let named = prop_oneof![
        Just(Policy::token_bucket(10, 3.0).unwrap()),
        Just(Policy::cell(15, 7, Duration::from_secs(60)).unwrap()),
        Just(Policy::cell(3, 7, Duration::from_secs(86_400)).unwrap()),
        Just(Policy::funnel(3, 3.0).unwrap()),
        Just(Policy::cell(100, 853, Duration::from_secs(3)).unwrap()),
    ];
    let nanos = (0u64..=5, 1u64..=3_000_000_000)
        .prop_map(|(b, t)| Policy::cell(b, 1, Duration::from_nanos(t)).unwrap());
    let rate = (1u64..=6, 1e-3f64..1e7).prop_map(|(c, r)| Policy::funnel(c, r).unwrap());
    prop_oneof![cell, named, nanos, rate].prop_flat_map(|p| {
        let span = (p.window().as_micros() as u64).clamp(1, 1 << 40);
        with_ops(p, span)
    })
}

fn window(
    f: fn(u64, Duration) -> Result<Policy, tower_throttle::PolicyError>,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=6, 1u64..=3_000_000).prop_flat_map(move |(max, w)| with_ops(f(max, us(w)).unwrap(), w))
}

fn concurrency() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=5, 1u64..=3_000_000).prop_flat_map(|(max, lease)| {
        with_ops(
            Policy::concurrency_with_lease(max, us(lease)).unwrap(),
            lease,
        )
    })
}

model_test!(gcra_matches_memory_store, gcra());
model_test!(gcra_at_any_interval_matches_memory_store, gcra_ns());
model_test!(
    sliding_log_matches_memory_store,
    window(Policy::sliding_log)
);
model_test!(
    fixed_window_matches_memory_store,
    window(Policy::fixed_window)
);
model_test!(
    sliding_window_matches_memory_store,
    window(Policy::sliding_window)
);
model_test!(concurrency_matches_memory_store, concurrency());

#[test]
fn sliding_log_bursts_at_one_instant_are_counted_exactly() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let p = Policy::sliding_log(30, Duration::from_secs(60)).unwrap();
        let k = b"burst";
        // Same-instant units, refunds from the top, more units, bigger bursts.
        for (cost, refund) in [(12, 3), (5, 0), (0, 0), (9, 11), (25, 0), (14, 2), (3, 0)] {
            let m = mem.check(Charge::new(k, &p, cost)).await.unwrap();
            let r = redis.check(Charge::new(k, &p, cost)).await.unwrap();
            assert_eq!(m, r, "cost {cost}");
            if let (Some(a), Some(b)) = (m.receipt(), r.receipt()) {
                mem.refund(k, &p, &a.part(refund)).await.unwrap();
                redis.refund(k, &p, &b.part(refund)).await.unwrap();
            }
        }
        let members: u64 = redis::cmd("ZCARD")
            .arg(redis.redis_key(k, &p))
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            members,
            30 - mem.check(Charge::new(k, &p, 0)).await.unwrap().remaining
        );
    });
}
