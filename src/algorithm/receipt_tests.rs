//! Where a window algorithm says a charge was taken, and the durations it
//! gives, from an instant behind the key's stored window (another
//! process's clock ahead).

use super::{fixed_window, sliding_window, WindowParams};
use crate::decision::{Decision, Receipt};

/// One window algorithm, over the state left by admissions `(at, cost)`.
struct Window {
    name: &'static str,
    /// When a charge in window 2 (of 10 ns) stops counting.
    stops_counting: u64,
    /// Decides `cost` at `now` over the state of admissions (at, cost).
    check: fn(&[(u64, u64)], u64, u64) -> Decision,
    /// The count in force after a refund of `receipt` at `now`.
    refunded: fn(&[(u64, u64)], u64, &Receipt) -> u64,
}

const P: WindowParams = WindowParams {
    max: 5,
    window_ns: 10,
};

fn fixed_state(charges: &[(u64, u64)]) -> fixed_window::FixedWindowState {
    charges.iter().fold(Default::default(), |s, &(at, cost)| {
        fixed_window::admit(&P, &s, at, cost)
    })
}

fn sliding_state(charges: &[(u64, u64)]) -> sliding_window::SlidingWindowState {
    charges.iter().fold(Default::default(), |s, &(at, cost)| {
        sliding_window::admit(&P, &s, at, cost)
    })
}

const WINDOWS: [Window; 2] = [
    Window {
        name: "fixed",
        stops_counting: 30,
        check: |charges, now, cost| fixed_window::check(&P, &fixed_state(charges), now, cost),
        refunded: |charges, now, r| fixed_window::refund(&P, &fixed_state(charges), now, r).count,
    },
    Window {
        name: "sliding",
        stops_counting: 40,
        check: |charges, now, cost| sliding_window::check(&P, &sliding_state(charges), now, cost),
        refunded: |charges, now, r| {
            sliding_window::refund(&P, &sliding_state(charges), now, r).current
        },
    },
];

/// A check at an instant before the stored window (another clock ahead)
/// counts in the stored window, and its receipt names that window: a
/// refund through it gives the units back there. In its own window a
/// charge is stamped at its instant; denials and peeks take nothing.
#[test]
fn a_charge_behind_the_stored_window_is_stamped_with_its_start() {
    for w in WINDOWS {
        let name = w.name;
        let ahead = [(21, 1)];
        let mut d = (w.check)(&ahead, 17, 3);
        assert!(d.allowed, "{name}");
        assert_eq!(d.charged_at_ns, 20, "{name}: the stored window's start");
        d.stamp(17, 3);
        let receipt = d.receipt().unwrap();
        assert_eq!(receipt.at_ns(), 20, "{name}");
        let charged = [(21, 1), (17, 3)];
        assert_eq!(
            (w.refunded)(&charged, 18, &receipt),
            1,
            "{name}: given back"
        );
        let mut d = (w.check)(&ahead, 23, 1);
        d.stamp(23, 1);
        assert_eq!(d.charged_at_ns, 23, "{name}: its own window");
        assert_eq!((w.check)(&ahead, 17, 5).charged_at_ns, 0, "{name}: denied");
        assert_eq!((w.check)(&ahead, 17, 0).charged_at_ns, 0, "{name}: a peek");
    }
}

/// Behind a later stored window, `reset_after` and `retry_after` count from
/// the check's own instant to the instants the stored window sets.
#[test]
fn durations_behind_the_stored_window_count_from_now() {
    for w in WINDOWS {
        let name = w.name;
        let ahead = [(21, 1)];
        let until = |ns: u64| std::time::Duration::from_nanos(ns);
        let admitted = (w.check)(&ahead, 17, 3);
        assert_eq!(admitted.reset_after, until(w.stops_counting - 17), "{name}");
        let denied = (w.check)(&ahead, 17, 5);
        assert!(!denied.allowed, "{name}");
        assert_eq!(
            denied.retry_after,
            Some(until(w.stops_counting - 17)),
            "{name}"
        );
        assert!(denied.quota_after <= denied.retry_after.unwrap(), "{name}");
    }
}
