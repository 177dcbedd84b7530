//! `quota_after` (the IETF `t`) per algorithm: the time until `remaining`
//! grows by one, not the time until the key is fully fresh.

use std::time::Duration;

use super::*;
use crate::decision::PermitId;
use crate::policy::{Algorithm, Policy};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_000 * S;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn gcra_t_is_the_next_unit() {
    let Algorithm::Gcra(p) = *Policy::token_bucket(10, 1.0).unwrap().algorithm() else {
        unreachable!()
    };
    let mut tat = 0;
    for _ in 0..5 {
        tat = gcra::admit(&p, tat, T0, 1);
    }
    let d = gcra::check(&p, tat, T0, 0);
    assert_eq!((d.remaining, d.reset_after), (5, secs(5)));
    // One unit drips back each second: t = 1 s, not the 5 s full reset.
    assert_eq!(d.quota_after, secs(1));
    for _ in 0..5 {
        tat = gcra::admit(&p, tat, T0, 1);
    }
    let d = gcra::check(&p, tat, T0, 1);
    assert!(!d.allowed);
    assert_eq!((d.reset_after, d.retry_after), (secs(10), Some(secs(1))));
    assert_eq!(d.quota_after, secs(1));
    // Half a second later, half a second to go.
    let d = gcra::check(&p, tat, T0 + S / 2, 0);
    assert_eq!(d.quota_after, Duration::from_millis(500));
    // Fresh: nothing more to come.
    assert_eq!(gcra::check(&p, 0, T0, 0).quota_after, Duration::ZERO);
}

#[test]
fn sliding_log_t_is_the_oldest_unit_leaving() {
    let Algorithm::SlidingLog(p) = *Policy::sliding_log(3, secs(60)).unwrap().algorithm() else {
        unreachable!()
    };
    let mut s = sliding_log::SlidingLogState::default();
    let d = sliding_log::check(&p, &s, T0, 1);
    assert_eq!((d.remaining, d.quota_after), (2, secs(60)));
    for at in [0, 10, 20] {
        sliding_log::admit(&p, &mut s, T0 + at * S, 1);
    }
    let d = sliding_log::check(&p, &s, T0 + 30 * S, 1);
    assert!(!d.allowed);
    assert_eq!(d.reset_after, secs(50));
    assert_eq!((d.retry_after, d.quota_after), (Some(secs(30)), secs(30)));
    // After the first unit left, the next one is the oldest.
    let d = sliding_log::check(&p, &s, T0 + 65 * S, 0);
    assert_eq!((d.remaining, d.quota_after), (1, secs(5)));
}

#[test]
fn fixed_window_t_is_the_window_end() {
    let Algorithm::FixedWindow(p) = *Policy::fixed_window(2, secs(60)).unwrap().algorithm() else {
        unreachable!()
    };
    let s = fixed_window::FixedWindowState::default();
    let now = 600 * S + 10 * S;
    let d = fixed_window::check(&p, &s, now, 1);
    assert_eq!(
        (d.remaining, d.quota_after, d.reset_after),
        (1, secs(50), secs(50))
    );
    assert_eq!(
        fixed_window::check(&p, &s, now, 0).quota_after,
        Duration::ZERO
    );
}

#[test]
fn sliding_window_t_is_the_estimate_dropping_by_one() {
    let Algorithm::SlidingWindow(p) = *Policy::sliding_window(10, secs(60)).unwrap().algorithm()
    else {
        unreachable!()
    };
    // 10 units in the previous window, half of it still covered: estimate 5.
    let s = sliding_window::SlidingWindowState {
        window: 10,
        current: 10,
        previous: 0,
    };
    let now = 11 * 60 * S + 30 * S;
    let d = sliding_window::check(&p, &s, now, 0);
    assert_eq!((d.remaining, d.reset_after), (5, secs(30)));
    // The estimate 10·(60 − e)/60 reaches 4 at e = 36 s: 6 s from now.
    assert_eq!(d.quota_after, secs(6));
    let d = sliding_window::check(&p, &s, now, 1);
    assert_eq!((d.remaining, d.quota_after), (4, secs(6)));
    // Full current window: the next drop comes in the next window.
    let s = sliding_window::SlidingWindowState {
        window: 11,
        current: 10,
        previous: 0,
    };
    let d = sliding_window::check(&p, &s, now, 1);
    assert!(!d.allowed);
    // 10·(60 − e)/60 ≤ 9 at e = 6 s into the next window: 36 s from now.
    assert_eq!((d.quota_after, d.retry_after), (secs(36), Some(secs(36))));
    assert_eq!(d.reset_after, secs(90));
}

#[test]
fn concurrency_t_is_the_first_lease_to_lapse() {
    let policy = Policy::concurrency_with_lease(2, secs(30)).unwrap();
    let Algorithm::Concurrency(p) = *policy.algorithm() else {
        unreachable!()
    };
    let mut s = concurrency::ConcurrencyState::default();
    concurrency::admit(&p, &mut s, T0, 1, PermitId(1));
    let d = concurrency::check(&p, &s, T0 + 10 * S, 1, PermitId(2));
    assert!(d.allowed);
    assert_eq!(
        (d.remaining, d.quota_after, d.reset_after),
        (0, secs(20), secs(30))
    );
    concurrency::admit(&p, &mut s, T0 + 10 * S, 1, PermitId(2));
    let d = concurrency::check(&p, &s, T0 + 10 * S, 1, PermitId(3));
    assert_eq!((d.retry_after, d.quota_after), (Some(secs(20)), secs(20)));
    let empty = concurrency::ConcurrencyState::default();
    assert_eq!(
        concurrency::check(&p, &empty, T0, 0, PermitId(4)).quota_after,
        Duration::ZERO
    );
}

/// Over many random states: `t` never exceeds the full reset, and for a
/// denial never exceeds the retry (so `Retry-After` ≥ `t`).
#[test]
fn t_is_bounded_by_reset_and_retry() {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let w = secs(7);
    let policies = [
        Policy::cell(4, 3, w).unwrap(),
        Policy::sliding_log(5, w).unwrap(),
        Policy::fixed_window(5, w).unwrap(),
        Policy::sliding_window(5, w).unwrap(),
        Policy::concurrency_with_lease(5, w).unwrap(),
    ];
    for policy in &policies {
        let (mut tat, mut log, mut fixed, mut sliding) = (
            0,
            Default::default(),
            Default::default(),
            Default::default(),
        );
        let mut conc = concurrency::ConcurrencyState::default();
        let mut now = T0;
        for i in 0..2_000 {
            now += next(3 * S);
            let cost = next(4);
            let d = match *policy.algorithm() {
                Algorithm::Gcra(p) => {
                    let d = gcra::check(&p, tat, now, cost);
                    if d.allowed {
                        tat = gcra::admit(&p, tat, now, cost);
                    }
                    d
                }
                Algorithm::SlidingLog(p) => {
                    let d = sliding_log::check(&p, &log, now, cost);
                    if d.allowed {
                        sliding_log::admit(&p, &mut log, now, cost);
                    }
                    d
                }
                Algorithm::FixedWindow(p) => {
                    let d = fixed_window::check(&p, &fixed, now, cost);
                    if d.allowed {
                        fixed = fixed_window::admit(&p, &fixed, now, cost);
                    }
                    d
                }
                Algorithm::SlidingWindow(p) => {
                    let d = sliding_window::check(&p, &sliding, now, cost);
                    if d.allowed {
                        sliding = sliding_window::admit(&p, &sliding, now, cost);
                    }
                    d
                }
                Algorithm::Concurrency(p) => {
                    let d = concurrency::check(&p, &conc, now, cost, PermitId(i));
                    if d.allowed {
                        concurrency::admit(&p, &mut conc, now, cost, PermitId(i));
                    }
                    d
                }
            };
            assert!(d.quota_after <= d.reset_after, "{policy:?} {d:?}");
            assert_eq!(
                d.quota_after.is_zero(),
                d.remaining >= d.limit,
                "{policy:?} {d:?}"
            );
            if let Some(retry) = d.retry_after {
                assert!(d.quota_after <= retry, "{policy:?} {d:?}");
                assert!(d.retry_after_secs().unwrap() >= d.quota_after_secs());
            }
        }
    }
}

/// The answer without figures the memory store gives a simple layer agrees
/// with the full decision: same verdict, same new state, overflow included.
#[test]
fn gcra_admits_agrees_with_check_and_admit() {
    let policies = [
        Policy::cell(15, 30, secs(60)).unwrap(),
        Policy::token_bucket(10, 1.0).unwrap(),
        Policy::cell(999_999, 1, secs(1)).unwrap(),
    ];
    let near_max = u64::MAX - S;
    for policy in &policies {
        let Algorithm::Gcra(p) = *policy.algorithm() else {
            unreachable!()
        };
        for now in [0, T0, near_max] {
            for ahead in [0, S / 3, 10 * S, 100 * S, u64::MAX] {
                let tat = now.saturating_add(ahead);
                for cost in [0, 1, 2, 15, 16, 1_000_000, u64::MAX] {
                    let d = gcra::check(&p, tat, now, cost);
                    let expected = d.allowed.then(|| gcra::admit(&p, tat, now, cost));
                    assert_eq!(
                        gcra::admits(&p, tat, now, cost),
                        expected,
                        "tat {tat} now {now} cost {cost}"
                    );
                }
            }
        }
    }
}
