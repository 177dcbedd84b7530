//! Random op sequences on the memory store against the reference models
//! (tests/models), decision by decision, on a manual clock.
#![no_main]

#[path = "../../tests/models/mod.rs"]
mod models;

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use models::Model;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::PermitId;
use tower_throttle::{MemoryStore, Policy, Rule};

#[derive(Arbitrary, Debug)]
enum Kind {
    Cell { burst: u8, count: u8 },
    Funnel { capacity: u8, rate_milli: u32 },
    SlidingLog,
    FixedWindow,
    SlidingWindow,
    Concurrency,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Advance(u32),
    AdvanceWindows(u8),
    Check { key: bool, cost: u8 },
    CheckAll { cost_a: u8, cost_b: u8 },
    Refund { key: bool, amount: u8 },
    Reset { key: bool },
    Release { key: bool, nth: u8 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: Kind,
    max: u8,
    window_us: u32,
    start: u64,
    ops: Vec<Op>,
}

fn policy(input: &Input) -> Option<Policy> {
    let max = u64::from(input.max % 8) + 1;
    let w = Duration::from_micros(u64::from(input.window_us % 10_000_000) + 1);
    match input.kind {
        Kind::Cell { burst, count } => {
            Policy::cell(u64::from(burst % 8), u64::from(count % 8) + 1, w).ok()
        }
        Kind::Funnel {
            capacity,
            rate_milli,
        } => Policy::funnel(
            u64::from(capacity % 8) + 1,
            f64::from(rate_milli % 10_000_000 + 1) / 1000.0,
        )
        .ok(),
        Kind::SlidingLog => Policy::sliding_log(max, w).ok(),
        Kind::FixedWindow => Policy::fixed_window(max, w).ok(),
        Kind::SlidingWindow => Policy::sliding_window(max, w).ok(),
        Kind::Concurrency => Policy::concurrency_with_lease(max, w).ok(),
    }
}

fuzz_target!(|input: Input| {
    let Some(policy) = policy(&input) else { return };
    // Far from both ends of the clock (the model's arithmetic is plain u64).
    let clock = ManualClock::starting_at(input.start % (1 << 62) + (1 << 40));
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .shards(2)
        .sweep_interval(None)
        .build();
    let mut model = Model::default();
    let mut permits: [Vec<PermitId>; 2] = Default::default();
    let window = policy.window();
    let limit = policy.limit();
    for op in input.ops.iter().take(64) {
        let now = clock.now_ns();
        let k = |key: bool| [b'k', u8::from(key)];
        match *op {
            Op::Advance(ns) => clock.advance(Duration::from_nanos(u64::from(ns))),
            Op::AdvanceWindows(n) => clock.advance(window * u32::from(n % 4)),
            Op::Check { key, cost } => {
                let cost = u64::from(cost) % (limit + 2);
                let got = store.check_sync(Rule::new(&k(key), &policy, cost)).unwrap();
                let id = got.permit.map_or(0, |p| p.0);
                let want = model.check(&k(key), &policy, now, cost, id);
                assert_eq!(got, want, "check key {key} cost {cost}");
                permits[usize::from(key)].extend(got.permit);
            }
            Op::CheckAll { cost_a, cost_b } => {
                let (ca, cb) = (
                    u64::from(cost_a) % (limit + 2),
                    u64::from(cost_b) % (limit + 2),
                );
                let (a, b) = (k(false), k(true));
                let got = store
                    .check_all_sync(&[Rule::new(&a, &policy, ca), Rule::new(&b, &policy, cb)])
                    .unwrap();
                let ids: Vec<u64> = got.iter().map(|d| d.permit.map_or(0, |p| p.0)).collect();
                let want =
                    model.check_all(&[(&a, &policy, ca, ids[0]), (&b, &policy, cb, ids[1])], now);
                assert_eq!(got, want, "check_all {ca} {cb}");
                permits[0].extend(got[0].permit);
                permits[1].extend(got[1].permit);
            }
            Op::Refund { key, amount } => {
                store.refund_sync(&k(key), &policy, u64::from(amount % 4));
                model.refund(&k(key), &policy, now, u64::from(amount % 4));
            }
            Op::Reset { key } => {
                store.reset_sync(&k(key));
                model.reset(&k(key));
                permits[usize::from(key)].clear();
            }
            Op::Release { key, nth } => {
                let held = &mut permits[usize::from(key)];
                if !held.is_empty() {
                    let id = held.remove(usize::from(nth) % held.len());
                    store.release_sync(&k(key), &policy, id);
                    model.release(&k(key), id.0);
                }
            }
        }
    }
});
