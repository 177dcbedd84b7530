//! The memory store against the reference models, decision by decision, over
//! random sequences of (advance time, check with cost, peek, refund, reset,
//! release) on a manual clock.

use crate::models;

use std::time::Duration;

use models::Model;
use proptest::prelude::*;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Check {
        key: u8,
        cost: u64,
    },
    /// Refunds `amount` units of the `nth` receipt held for `key`.
    Refund {
        key: u8,
        nth: usize,
        amount: u64,
    },
    Reset {
        key: u8,
    },
    Release {
        key: u8,
        nth: usize,
    },
}

fn ops(limit: u64, window_ns: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        2 => (0..1_000u64).prop_map(Op::Advance),
        3 => (0..window_ns / 4 + 1).prop_map(Op::Advance),
        1 => (0..window_ns * 2 + 1).prop_map(Op::Advance),
        8 => (0..2u8, 0..=limit + 1).prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => (0..2u8, 0..8usize, 0..3u64).prop_map(|(key, nth, amount)| Op::Refund { key, nth, amount }),
        1 => (0..2u8).prop_map(|key| Op::Reset { key }),
        2 => (0..2u8, 0..8usize).prop_map(|(key, nth)| Op::Release { key, nth }),
    ];
    proptest::collection::vec(op, 1..48)
}

fn store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .shards(4)
        .sweep_interval(None)
        .build()
}

/// Runs `ops` against the store and the model; fails on the first difference.
fn run(policy: Policy, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let store = store(&clock);
    let mut model = Model::default();
    let mut permits: [Vec<PermitId>; 2] = Default::default();
    let mut receipts: [Vec<Receipt>; 2] = Default::default();
    for (step, op) in ops.into_iter().enumerate() {
        let now = clock.now_ns();
        match op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(ns)),
            Op::Check { key, cost } => {
                let k = [b'k', key];
                let got = store.check_sync(Charge::new(&k, &policy, cost)).unwrap();
                let id = got.permit.map_or(0, |p| p.0);
                let want = model.check(&k, &policy, now, cost, id);
                prop_assert_eq!(got, want, "step {} check key {} cost {}", step, key, cost);
                permits[key as usize].extend(got.permit);
                receipts[key as usize].extend(got.receipt());
            }
            Op::Refund { key, nth, amount } => {
                let held = &mut receipts[key as usize];
                if !held.is_empty() {
                    let receipt = held.swap_remove(nth % held.len()).part(amount);
                    let k = [b'k', key];
                    store.refund_sync(&k, &policy, &receipt);
                    model.refund(&k, &policy, now, &receipt);
                }
            }
            Op::Reset { key } => {
                let k = [b'k', key];
                store.reset_sync(&k);
                model.reset(&k);
                permits[key as usize].clear();
                receipts[key as usize].clear();
            }
            Op::Release { key, nth } => {
                let held = &mut permits[key as usize];
                if !held.is_empty() {
                    let id = held.remove(nth % held.len());
                    let k = [b'k', key];
                    store.release_sync(&k, &policy, id);
                    model.release(&k, id.0);
                }
            }
        }
    }
    Ok(())
}

fn cases() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1000);
    ProptestConfig::with_cases(cases)
}

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        1_000..1_000_000u64,                        // sub-millisecond
        (1..60u64).prop_map(|s| s * 1_000_000_000), // whole seconds
        1_000_000..120_000_000_000u64,              // odd nanoseconds
    ]
}

fn with_ops(policy: Policy) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (
        Just(policy),
        ops(policy.limit(), policy.window().as_nanos() as u64),
    )
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn gcra_matches_model(
        (policy, ops) in (0..6u64, 1..6u64, window())
            .prop_filter_map("valid", |(burst, count, w)| Policy::cell(burst, count, Duration::from_nanos(w)).ok())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    #[test]
    fn funnel_and_token_bucket_match_model(
        (policy, ops) in (1..6u64, 0.01..1000.0f64, any::<bool>())
            .prop_map(|(c, r, funnel)| if funnel { Policy::funnel(c, r) } else { Policy::token_bucket(c, r) }.unwrap())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    #[test]
    fn sliding_log_matches_model(
        (policy, ops) in (1..7u64, window())
            .prop_map(|(n, w)| Policy::sliding_log(n, Duration::from_nanos(w)).unwrap())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    #[test]
    fn fixed_window_matches_model(
        (policy, ops) in (1..7u64, window())
            .prop_map(|(n, w)| Policy::fixed_window(n, Duration::from_nanos(w)).unwrap())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    #[test]
    fn sliding_window_matches_model(
        (policy, ops) in (1..7u64, window())
            .prop_map(|(n, w)| Policy::sliding_window(n, Duration::from_nanos(w)).unwrap())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    #[test]
    fn concurrency_matches_model(
        (policy, ops) in (1..6u64, window())
            .prop_map(|(n, lease)| Policy::concurrency_with_lease(n, Duration::from_nanos(lease)).unwrap())
            .prop_flat_map(with_ops)
    ) {
        run(policy, ops)?;
    }

    /// Several rules in one call: all or nothing, against the model.
    #[test]
    fn multi_rule_is_all_or_nothing(
        steps in proptest::collection::vec((0..3_000_000_000u64, 0..4u64, 0..4u64), 1..40),
    ) {
        let per_second = Policy::sliding_log(3, Duration::from_secs(1)).unwrap();
        let burst = Policy::cell(1, 1, Duration::from_millis(700)).unwrap();
        let windowed = Policy::sliding_window(5, Duration::from_secs(2)).unwrap();
        let clock = ManualClock::new();
        let store = store(&clock);
        let mut model = Model::default();
        for (advance, cost_a, cost_b) in steps {
            clock.advance(Duration::from_nanos(advance % 1_500_000_000));
            let now = clock.now_ns();
            let rules = [
                Charge::new(b"a", &per_second, cost_a),
                Charge::new(b"b", &burst, cost_b),
                Charge::new(b"c", &windowed, 1),
            ];
            let got = store.check_all_sync(&rules).unwrap();
            let want = model.check_all(
                &[(b"a", &per_second, cost_a, 0), (b"b", &burst, cost_b, 0), (b"c", &windowed, 1, 0)],
                now,
            );
            prop_assert_eq!(got, want);
        }
    }
}
