//! The sliding-window counter: two fixed-window counts, the previous one
//! weighted by how much of it the sliding window still covers.
//!
//! estimate = previous·(1 − elapsed/window) + current, compared in integers
//! (everything multiplied by `window`) so that every store computes the same
//! answer bit for bit. The estimate never rises without an admission and is
//! continuous across window boundaries, so `retry_after` is exact.

use super::WindowParams;
use super::{dur, sat};
use crate::decision::{Decision, Receipt};

/// Counts of the current and previous windows. `Default` is a fresh key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Index of the current window: `floor(t / window)`.
    pub window: u64,
    /// Units admitted in the current window.
    pub current: u64,
    /// Units admitted in the window before it.
    pub previous: u64,
}

/// The state rolled forward to `now`, and the time elapsed in its window. A
/// stored window later than `now` (the clock went back) is kept, with elapsed
/// 0, where its estimate is highest.
fn roll(p: &WindowParams, s: &SlidingWindowState, now: u64) -> (SlidingWindowState, u128) {
    let w = p.window_ns;
    let index = now / w;
    let rolled = if s.window >= index {
        *s
    } else if s.window + 1 == index {
        SlidingWindowState {
            window: index,
            current: 0,
            previous: s.current,
        }
    } else {
        SlidingWindowState {
            window: index,
            current: 0,
            previous: 0,
        }
    };
    let start = u128::from(rolled.window) * u128::from(w);
    let elapsed = u128::from(now).saturating_sub(start).min(u128::from(w));
    (rolled, elapsed)
}

/// Decides a request of `cost` units. An admission counted in a stored
/// window later than `now`'s carries that window's start as
/// `charged_at_ns` (0 otherwise): the instant its receipt must name.
pub fn check(p: &WindowParams, s: &SlidingWindowState, now: u64, cost: u64) -> Decision {
    let (s, elapsed) = roll(p, s, now);
    let w = u128::from(p.window_ns);
    let (n, cost_w) = (u128::from(p.max), u128::from(cost));
    let (prev, cur) = (u128::from(s.previous), u128::from(s.current));
    // All terms scaled by w: estimate·w = prev·(w − elapsed) + cur·w.
    let used = prev * (w - elapsed) + cur * w;
    let allowed = used + cost_w * w <= n * w;
    let used_after = if allowed { used + cost_w * w } else { used };
    let start = u128::from(s.window) * w;
    // Every duration counts from `now`, also behind a later stored window
    // (where `start` > `now`): each instant below is at or after `start`.
    let now_u = u128::from(now);
    let current_after = if allowed { cur + cost_w } else { cur };
    let reset_at = if current_after > 0 {
        start + 2 * w
    } else if prev > 0 {
        start + w
    } else {
        now_u
    };
    let retry_after = if allowed || cost_w > n {
        None
    } else if cur + cost_w <= n {
        // Within this window, once prev·(w − e) ≤ (n − cur − cost)·w.
        let room = (n - cur - cost_w) * w;
        let e = w - (room / prev).min(w);
        Some(dur(start + e - now_u))
    } else {
        // In the next window, `cur` becomes the weighted previous count.
        let room = (n - cost_w) * w;
        let e = room.checked_div(cur).map_or(0, |fit| w - fit.min(w));
        Some(dur(start + w + e - now_u))
    };
    let remaining = sat((n * w).saturating_sub(used_after) / w);
    // More quota comes once the estimate drops by one unit: when
    // estimate·w ≤ (n − remaining − 1)·w.
    let quota_after = if u128::from(remaining) >= n {
        Default::default()
    } else {
        let target = (n - u128::from(remaining) - 1) * w;
        dur(until_at_most(prev, current_after, start, w, target).saturating_sub(now_u))
    };
    Decision {
        charged: 0,
        // `start` after `now`: a later window than `now`'s, kept by `roll`.
        charged_at_ns: if allowed && cost > 0 && start > u128::from(now) {
            u64::try_from(start).unwrap_or(u64::MAX)
        } else {
            0
        },
        decided_by: Default::default(),
        allowed,
        limit: p.max,
        remaining,
        retry_after,
        reset_after: dur(reset_at - now_u),
        quota_after,
        permit: None,
    }
}

/// The first instant at which estimate·w ≤ `target`, for a state of counts
/// `prev` and `cur` in the window starting at `start`: still in this window
/// if the current count alone fits, otherwise in the next one, where `cur`
/// becomes the weighted previous count. Needs estimate·w > `target` now.
fn until_at_most(prev: u128, cur: u128, start: u128, w: u128, target: u128) -> u128 {
    if cur * w <= target {
        // prev·(w − e) ≤ target − cur·w; prev > 0 since the estimate is over.
        let e = w - ((target - cur * w) / prev.max(1)).min(w);
        start + e
    } else {
        let e = w - (target / cur).min(w);
        start + w + e
    }
}

/// The state after admitting `cost` units; call only when [`check`] allowed.
pub fn admit(p: &WindowParams, s: &SlidingWindowState, now: u64, cost: u64) -> SlidingWindowState {
    let (mut s, _) = roll(p, s, now);
    s.current = s.current.saturating_add(cost);
    s
}

/// Gives a charge's units back to the count of the window it was taken
/// in: the current count while that window lasts, the previous count in
/// the window after it, nothing once it has left the estimate.
pub fn refund(
    p: &WindowParams,
    s: &SlidingWindowState,
    now: u64,
    r: &Receipt,
) -> SlidingWindowState {
    let (mut s, _) = roll(p, s, now);
    let charged = r.at_ns() / p.window_ns;
    if s.window == charged {
        s.current = s.current.saturating_sub(r.units());
    } else if s.window == charged.saturating_add(1) {
        s.previous = s.previous.saturating_sub(r.units());
    }
    s
}

/// When the state is indistinguishable from a fresh key.
pub fn expires_at(p: &WindowParams, s: &SlidingWindowState) -> u64 {
    let windows_left = if s.current > 0 {
        2
    } else if s.previous > 0 {
        1
    } else {
        return 0;
    };
    s.window
        .saturating_add(windows_left)
        .saturating_mul(p.window_ns)
}
