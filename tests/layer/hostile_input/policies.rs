//! Policy values at and past every limit: typed errors, and accepted extremes decide without panicking.

use std::time::Duration;

use super::{all_policies, YEAR};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, PolicyError};

#[test]
fn policy_values_at_and_past_every_limit_are_typed_errors() {
    let all = all_policies();
    let (mut ok, mut errs) = (0, 0);
    for (what, p) in &all {
        match p {
            Ok(p) => {
                ok += 1;
                assert!(p.limit() >= 1, "{what}");
                assert!(p.window() > Duration::ZERO, "{what}");
            }
            Err(e) => {
                errs += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    println!(
        "{} policies tried: {ok} accepted, {errs} typed errors",
        all.len()
    );
    // Spot checks of the error kinds.
    let s = Duration::from_secs(1);
    assert_eq!(
        Policy::sliding_log(0, s),
        Err(PolicyError::ZeroCount("max"))
    );
    assert_eq!(
        Policy::fixed_window(1, Duration::ZERO),
        Err(PolicyError::ZeroPeriod("window"))
    );
    assert!(matches!(
        Policy::sliding_window(1, Duration::MAX),
        Err(PolicyError::Overflow(_))
    ));
    assert!(matches!(
        Policy::cell(0, 1, Duration::from_secs(585 * YEAR)),
        Err(PolicyError::Overflow(_))
    ));
    assert!(Policy::cell(0, 1, Duration::from_secs(500 * YEAR)).is_ok());
    assert!(matches!(
        Policy::cell(0, 2, Duration::from_nanos(1)),
        Err(PolicyError::IntervalTooShort { .. })
    ));
    assert!(Policy::cell(0, 1, Duration::from_nanos(1)).is_ok());
    for r in [f64::NAN, f64::INFINITY, -1.0, 0.0, 1e10] {
        assert!(
            matches!(Policy::funnel(1, r), Err(PolicyError::InvalidRate(_))),
            "{r}"
        );
    }
    for r in [5e-324, 1e-300] {
        assert!(
            matches!(Policy::token_bucket(1, r), Err(PolicyError::Overflow(_))),
            "{r}"
        );
    }
    assert!(matches!(
        Policy::concurrency_with_lease(1, Duration::MAX),
        Err(PolicyError::Overflow(_))
    ));
    // A burst times the interval that overflows.
    assert!(matches!(
        Policy::cell(u64::MAX / 2, 1, Duration::from_secs(1)),
        Err(PolicyError::Overflow(_))
    ));
}

/// Every accepted extreme policy decides without panicking at extreme costs
/// and times, and never reports more remaining than its limit.
#[test]
fn accepted_extreme_policies_decide_without_panicking() {
    let mut checks = 0;
    for start in [0, 1_700_000_000_000_000_000, u64::MAX - 1] {
        let clock = ManualClock::starting_at(start);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .sweep_interval(None)
            .build();
        for (i, (what, p)) in all_policies().into_iter().enumerate() {
            let Ok(p) = p else { continue };
            let key = i.to_le_bytes();
            for cost in [0, 1, p.limit(), p.limit().saturating_add(1), u64::MAX] {
                let d = store.check_sync(Charge::new(&key, &p, cost)).unwrap();
                checks += 1;
                assert!(d.remaining <= p.limit(), "{what} cost {cost}: {d:?}");
                if cost > p.limit() {
                    assert!(d.is_never(), "{what} cost {cost}: {d:?}");
                }
                let _ = d.to_cell_reply();
                let _ = d.retry_after_secs();
            }
            // Forged receipts: every unit, at the extremes of the clock.
            for at in [0, u64::MAX] {
                store.refund_sync(
                    &key,
                    &p,
                    &Receipt::new(u64::MAX, at, Some(PermitId(u64::MAX))),
                );
            }
            if let Some(id) = store.check_sync(Charge::new(&key, &p, 1)).unwrap().permit {
                store.release_sync(&key, &p, id);
            }
            store.release_sync(&key, &p, PermitId(u64::MAX));
            store.reset_sync(&key);
        }
        clock.set_ns(start / 3);
    }
    println!("{checks} checks of extreme policies at extreme times");
}
