//! A leasing store answers a check alike through `check` (its own path,
//! which hands a lease's decision back without wrapping it) and through
//! `decide`: the same schedule of checks and refunds, on hot and cold keys,
//! leased windows and GCRA, costs 0 to 3, charges with and without
//! figures, with and without prefetching,
//! under a manual clock, gives the same decisions, receipts included.

use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::decision::Decision;
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Charge, MemoryStore, Store, StoreError};
use tower_throttle::Policy;

/// The store of one run: a leasing store over its own memory store.
fn leasing(clock: &ManualClock, prefetch: bool) -> LeasingStore<MemoryStore<ManualClock>> {
    let inner = MemoryStore::builder().clock(clock.clone()).build();
    LeasingStore::builder(inner)
        .clock(clock.clone())
        .hot_threshold(3)
        .initial_block(4)
        .max_block(16)
        .prefetch(prefetch)
        .expiry_margin(Duration::ZERO)
        .build()
        .unwrap()
}

/// Runs the schedule of `seed` through `check` or `decide`: every answer,
/// and after how many of them the key held units of a lease.
async fn run(
    seed: u64,
    prefetch: bool,
    by_check: bool,
) -> (Vec<Result<Decision, StoreError>>, usize) {
    let clock = ManualClock::starting_at(3_600_000_000_000);
    let store = leasing(&clock, prefetch);
    let policies = [
        Policy::fixed_window(40, Duration::from_secs(1)).unwrap(),
        Policy::sliding_window(40, Duration::from_secs(1)).unwrap(),
        Policy::cell(39, 40, Duration::from_secs(1)).unwrap(),
    ];
    // Each key mostly under one policy, so that it is leased; now and then
    // the hot window's key is checked under GCRA (a policy replaced).
    let pairs: [(&[u8], usize); 6] = [
        (b"window", 0),
        (b"window", 0),
        (b"gcra", 2),
        (b"gcra", 2),
        (b"sliding", 1),
        (b"cold", 0),
    ];
    let mut state = seed | 1;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let (mut answers, mut held) = (Vec::new(), 0);
    for _ in 0..3_000 {
        let (key, mut p) = pairs[next(6) as usize];
        if p == 0 && next(50) == 0 {
            p = 2;
        }
        let policy = &policies[p];
        let cost = [1, 1, 1, 1, 0, 2, 3][next(7) as usize];
        let mut charge = Charge::new(key, policy, cost);
        if next(4) == 0 {
            // The store reads the inner store's figures all the same.
            charge = charge.without_figures();
        }
        let answer = if by_check {
            store.check(charge).await
        } else {
            store.decide(&[charge]).await.and_then(|d| d.into_one())
        };
        // Some admissions are given back, into the lease or the store.
        if let Ok(Some(receipt)) = answer.as_ref().map(Decision::receipt) {
            if next(8) == 0 {
                store.refund(key, policy, &receipt).await.unwrap();
            }
        }
        answers.push(answer);
        held += usize::from(store.local_units(key) > 0);
        clock.advance(Duration::from_micros(next(10_000)));
    }
    (answers, held)
}

#[tokio::test]
async fn check_and_decide_answer_alike() {
    for seed in [1, 0x9e37_79b9, 0xdead_beef_cafe] {
        for prefetch in [true, false] {
            let (checked, held) = run(seed, prefetch, true).await;
            let (decided, _) = run(seed, prefetch, false).await;
            let denied = checked.iter().filter(|a| matches!(a, Ok(d) if !d.allowed));
            let denied = denied.count();
            assert!(held > 800, "seed {seed}: a lease held after {held} checks");
            assert!(denied > 300, "seed {seed}: {denied} denials");
            for (step, (a, b)) in checked.iter().zip(&decided).enumerate() {
                assert_eq!(
                    format!("{a:?}"),
                    format!("{b:?}"),
                    "seed {seed}, prefetch {prefetch}, step {step}"
                );
            }
        }
    }
}
