//! The sliding log: the exact record of admitted units over the last window.
//!
//! The classic ZSET log keeps one member per request with the millisecond as the
//! member, so two requests in one millisecond collapse into one. Here every
//! admitted unit counts; units admitted at the same instant share one entry
//! with a count, which keeps memory at O(distinct instants) ≤ O(max).

use std::collections::VecDeque;

use super::dur;
use super::WindowParams;
use crate::decision::{Decision, Receipt};

/// Admitted units, oldest first. `Default` is a fresh key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl SlidingLogState {
    /// `(instant_ns, units)` pairs, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }
}

/// An entry admitted at `t` leaves the window once `now ≥ t + window`.
#[inline]
fn expired(p: &WindowParams, t: u64, now: u64) -> bool {
    u128::from(t) + u128::from(p.window_ns) <= u128::from(now)
}

/// Units still in the window at `now`, and how many entries have left it.
fn live(p: &WindowParams, s: &SlidingLogState, now: u64) -> (u64, usize) {
    let mut total = s.total;
    let mut gone = 0;
    for &(t, n) in &s.entries {
        if !expired(p, t, now) {
            break;
        }
        total -= n;
        gone += 1;
    }
    (total, gone)
}

/// Decides a request of `cost` units.
pub fn check(p: &WindowParams, s: &SlidingLogState, now: u64, cost: u64) -> Decision {
    let (total, gone) = live(p, s, now);
    let allowed = u128::from(total) + u128::from(cost) <= u128::from(p.max);
    let newest = if allowed && cost > 0 {
        Some(now)
    } else {
        s.entries.back().map(|&(t, _)| t).filter(|_| total > 0)
    };
    let after = if allowed { total + cost } else { total };
    let until =
        |t: u64| dur((u128::from(t) + u128::from(p.window_ns)).saturating_sub(u128::from(now)));
    let retry_after = if allowed || cost > p.max {
        None
    } else {
        // The oldest `must_leave` units have to leave the window first
        // (total + cost − max, without overflow: here cost ≤ max < total + cost).
        let must_leave = total - (p.max - cost);
        let mut left = 0;
        s.entries
            .iter()
            .skip(gone)
            .find(|&&(_, n)| {
                left += n;
                left >= must_leave
            })
            .map(|&(t, _)| until(t))
    };
    let remaining = p.max.saturating_sub(after);
    // More quota comes when the oldest unit in the window leaves it (the one
    // just admitted if the window was empty).
    let oldest = s.entries.get(gone).map(|&(t, _)| t).filter(|_| total > 0);
    let oldest = if allowed && cost > 0 {
        Some(oldest.unwrap_or(now))
    } else {
        oldest
    };
    Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.max,
        remaining,
        retry_after,
        reset_after: newest.map(until).unwrap_or_default(),
        quota_after: oldest
            .filter(|_| remaining < p.max)
            .map(until)
            .unwrap_or_default(),
        permit: None,
    }
}

/// Drops the entries that have left the window (changes no decision).
pub fn prune(p: &WindowParams, s: &mut SlidingLogState, now: u64) {
    while let Some(&(t, n)) = s.entries.front() {
        if !expired(p, t, now) {
            break;
        }
        s.total -= n;
        s.entries.pop_front();
    }
}

/// Records `cost` units at `now`; call only when [`check`] allowed.
pub fn admit(p: &WindowParams, s: &mut SlidingLogState, now: u64, cost: u64) {
    prune(p, s, now);
    if cost == 0 {
        return;
    }
    s.total += cost;
    match s.entries.back_mut() {
        // A clock that went back still appends in order: the entry is kept
        // at the later instant, which can only hold the units longer.
        Some((t, n)) if *t >= now => *n += cost,
        _ => s.entries.push_back((now, cost)),
    }
}

/// Gives a charge's units back: removes them from the entry at the
/// charge's instant, not from the newest one (which may be another
/// request's). An entry that has left the window, or was merged into a
/// later instant by a clock that went back, is left as it is.
pub fn refund(p: &WindowParams, s: &mut SlidingLogState, now: u64, r: &Receipt) {
    prune(p, s, now);
    let at = r.at_ns();
    // Entries are in instant order: the charge's is found by binary search.
    let Ok(i) = s.entries.binary_search_by_key(&at, |&(t, _)| t) else {
        return;
    };
    let n = &mut s.entries[i].1;
    let take = r.units().min(*n);
    *n -= take;
    s.total -= take;
    if *n == 0 {
        s.entries.remove(i);
    }
}

/// When the state is indistinguishable from a fresh key.
pub fn expires_at(p: &WindowParams, s: &SlidingLogState) -> u64 {
    s.entries
        .back()
        .map_or(0, |&(t, _)| t.saturating_add(p.window_ns))
}
