//! Sliding windows whose products pass 2^53 on Redis (issue 11): counts up
//! to 10^6 and windows up to a year, whole µs or not, decide as the memory
//! store does; the script compares prev·(w − e) with (max − cur − cost)·w
//! in limbs where the doubles would round.

use crate::model_bench;

use std::time::Duration;

use model_bench::{with_ops, Bench, Op};
use proptest::prelude::*;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

/// Windows from a second to a year and a day, whole µs or not, with counts
/// up to 10^6 (large ones often): (3·max + 2)·w mostly passes 2^52.
fn large_sliding() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let year = 366 * 86_400 * 1_000_000_000u64;
    let w = prop_oneof![
        2 => (1_000_000_000..=year).prop_map(|n| n / 1000 * 1000),
        2 => 1_000_000_000..=year,
        1 => Just(86_400_000_000_000u64),
        1 => Just(365 * 86_400_000_000_000 + 1),
    ];
    let max = prop_oneof![1u64..=6, 1_000u64..=1_000_000, Just(1_000_000)];
    (max, w).prop_flat_map(|(max, w)| {
        with_ops(
            Policy::sliding_window(max, Duration::from_nanos(w)).unwrap(),
            w / 1000,
        )
    })
}

long_model_test!(
    sliding_window_with_products_past_2_53_matches_memory_store,
    large_sliding()
);

/// `Policy::sliding_window(1_000_000, 1 day)`: a full previous window lets
/// one more unit in exactly when 10^6·(w − e) ≤ (10^6 − 1)·w, at e = w / 10^6
/// = 86,400 µs into the next window, and not one µs before (products of
/// 8.64·10^16, past 2^53).
#[test]
fn a_day_long_million_sliding_window_admits_at_the_exact_instant() {
    let bench = Bench::new();
    let day_us = 86_400_000_000u64;
    let policy = Policy::sliding_window(1_000_000, Duration::from_micros(day_us)).unwrap();
    let start = 1_700_000_000_000_000 / day_us * day_us + day_us;
    let ops = || {
        vec![
            Op::Check(1_000_000),
            Op::Advance(day_us + 86_399),
            Op::Check(1),
            Op::Advance(1),
            Op::Check(1),
            Op::Check(1),
        ]
    };
    bench.clock.set_ns(start * 1000);
    bench.run(policy, ops()).unwrap();
    bench.clock.set_ns(start * 1000);
    let mut allowed = Vec::new();
    bench.rt.block_on(async {
        for op in ops() {
            match op {
                Op::Advance(n) => bench.clock.advance(Duration::from_micros(n)),
                Op::Check(c) => {
                    let d = bench
                        .redis
                        .check(Charge::new(b"tie", &policy, c))
                        .await
                        .unwrap();
                    allowed.push(d.allowed);
                }
                _ => unreachable!(),
            }
        }
    });
    assert_eq!(allowed, [true, false, true, false]);
}
