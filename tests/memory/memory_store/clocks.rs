//! Clock faults: jumping back, stalled, extreme costs and times.

use std::time::Duration;

use super::{all_policies, manual_store};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;

#[test]
fn clock_jumping_backwards_never_admits_more() {
    for (name, policy) in all_policies() {
        let clock = ManualClock::starting_at(1_000_000_000_000);
        let store = manual_store(&clock);
        let mut admitted = 0;
        for step in 0..200u64 {
            // Forward 1 ms, then every 10th step back by 5 s (never below the start).
            if step % 10 == 9 {
                clock.set_ns(
                    clock
                        .now_ns()
                        .saturating_sub(5_000_000_000)
                        .max(1_000_000_000_000),
                );
            } else {
                clock.advance(Duration::from_millis(1));
            }
            admitted += u64::from(
                store
                    .check_sync(Charge::new(b"k", &policy, 1))
                    .unwrap()
                    .allowed,
            );
        }
        // At most 200 ms of forward motion: the burst plus what 0.2 s refills.
        assert!(admitted <= 15 + 1, "{name} admitted {admitted}");
        let _ = store
            .check_sync(Charge::new(b"k", &policy, u64::MAX))
            .unwrap();
    }
}

#[test]
fn stalled_clock_admits_only_the_burst() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    for (name, policy) in all_policies() {
        let key = name.as_bytes();
        let admitted = (0..1000)
            .filter(|_| {
                store
                    .check_sync(Charge::new(key, &policy, 1))
                    .unwrap()
                    .allowed
            })
            .count();
        assert_eq!(admitted, 15, "{name}");
    }
}

#[test]
fn huge_costs_and_extreme_times_do_not_panic() {
    for start in [0, 1, u64::MAX / 2, u64::MAX - 1] {
        let clock = ManualClock::starting_at(start);
        let store = manual_store(&clock);
        for (name, policy) in all_policies() {
            for cost in [0, 1, 15, 16, u64::MAX] {
                let d = store.check_sync(Charge::new(b"k", &policy, cost)).unwrap();
                if cost > 15 {
                    assert!(d.is_never(), "{name} cost {cost} at {start}: {d:?}");
                }
            }
            let forged = Receipt::new(u64::MAX, clock.now_ns(), None);
            store.refund_sync(b"k", &policy, &forged);
            clock.advance(Duration::MAX);
        }
    }
}
