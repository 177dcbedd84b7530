//! The fixed-window counter: `INCR` on a key named after `floor(now / window)`.

use super::dur;
use super::WindowParams;
use crate::decision::{Decision, Receipt};

/// The counter of one window. `Default` is a fresh key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedWindowState {
    /// Index of the window the count belongs to: `floor(t / window)`.
    pub window: u64,
    /// Units admitted in that window.
    pub count: u64,
}

/// The window in force at `now` and its count. A stored window later than
/// `now` (the clock went back) stays in force rather than being forgotten.
fn effective(p: &WindowParams, s: &FixedWindowState, now: u64) -> (u64, u64) {
    let current = now / p.window_ns;
    if s.window >= current {
        (s.window, s.count)
    } else {
        (current, 0)
    }
}

/// Decides a request of `cost` units. An admission counted in a stored
/// window later than `now`'s carries that window's start as
/// `charged_at_ns` (0 otherwise): the instant its receipt must name.
pub fn check(p: &WindowParams, s: &FixedWindowState, now: u64, cost: u64) -> Decision {
    let (window, count) = effective(p, s, now);
    let end = (u128::from(window) + 1) * u128::from(p.window_ns);
    let until_end = dur(end - u128::from(now));
    let allowed = u128::from(count) + u128::from(cost) <= u128::from(p.max);
    let after = if allowed { count + cost } else { count };
    let remaining = p.max.saturating_sub(after);
    Decision {
        charged: 0,
        charged_at_ns: if allowed && cost > 0 && window > now / p.window_ns {
            u64::try_from(end - u128::from(p.window_ns)).unwrap_or(u64::MAX)
        } else {
            0
        },
        decided_by: Default::default(),
        allowed,
        limit: p.max,
        remaining,
        retry_after: (!allowed && cost <= p.max).then_some(until_end),
        reset_after: if after > 0 {
            until_end
        } else {
            Default::default()
        },
        // More quota comes only when the window ends.
        quota_after: if remaining < p.max {
            until_end
        } else {
            Default::default()
        },
        permit: None,
    }
}

/// The state after admitting `cost` units; call only when [`check`] allowed.
pub fn admit(p: &WindowParams, s: &FixedWindowState, now: u64, cost: u64) -> FixedWindowState {
    let (window, count) = effective(p, s, now);
    FixedWindowState {
        window,
        count: count.saturating_add(cost),
    }
}

/// Gives a charge's units back to the window it was taken in, if that
/// window is still in force at `now`; a window that has ended keeps its
/// count (its requests were admitted against it).
pub fn refund(p: &WindowParams, s: &FixedWindowState, now: u64, r: &Receipt) -> FixedWindowState {
    let (window, count) = effective(p, s, now);
    let count = if window == r.at_ns() / p.window_ns {
        count.saturating_sub(r.units())
    } else {
        count
    };
    FixedWindowState { window, count }
}

/// When the state is indistinguishable from a fresh key.
pub fn expires_at(p: &WindowParams, s: &FixedWindowState) -> u64 {
    if s.count == 0 {
        0
    } else {
        s.window.saturating_add(1).saturating_mul(p.window_ns)
    }
}
