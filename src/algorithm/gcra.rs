//! GCRA, exactly as redis-cell's `CL.THROTTLE` computes it.
//!
//! State is one number, the theoretical arrival time (`tat`); any value at or
//! before `now` means a fresh key. Funnels and token buckets are this machine
//! with T = 1/rate and limit = capacity.

use std::time::Duration;

use super::GcraParams;
use super::{dur, sat};
use crate::decision::{Decision, Receipt};

/// Decides a request of `cost` units against `tat` at `now`.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::policy::Algorithm;
/// use tower_throttle::{algorithm::gcra, Policy};
///
/// let Algorithm::Gcra(p) = *Policy::cell(15, 30, Duration::from_secs(60))?.algorithm() else { unreachable!() };
/// let now = 1_000_000_000_000;
/// let d = gcra::check(&p, 0, now, 1);
/// assert_eq!(d.to_cell_reply(), [0, 16, 15, -1, 2]);
/// assert_eq!(gcra::admit(&p, 0, now, 1), now + 2_000_000_000);
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[inline(always)]
pub fn check(p: &GcraParams, tat: u64, now: u64, cost: u64) -> Decision {
    // Fast path in u64 (a u128 division is a libcall); the same formulas as
    // `check_wide`, which takes over whenever a sum or product would overflow.
    let (t, tau) = (p.emission_interval_ns, p.tolerance_ns);
    let base = tat.max(now);
    let (Some(inc), Some(horizon)) = (t.checked_mul(cost), now.checked_add(tau)) else {
        return check_wide(p, tat, now, cost);
    };
    let Some(new_tat) = base.checked_add(inc) else {
        return check_wide(p, tat, now, cost);
    };
    let allowed = new_tat <= horizon;
    let ttl = if allowed { new_tat - now } else { base - now };
    let remaining = remaining(p, ttl);
    Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.limit,
        remaining,
        retry_after: (!allowed && inc <= tau).then(|| Duration::from_nanos(new_tat - horizon)),
        reset_after: Duration::from_nanos(ttl),
        quota_after: quota_after(p, ttl, remaining),
        permit: None,
    }
}

#[cold]
fn check_wide(p: &GcraParams, tat: u64, now: u64, cost: u64) -> Decision {
    let t = u128::from(p.emission_interval_ns);
    let tau = u128::from(p.tolerance_ns);
    let now_w = u128::from(now);
    let tat_w = u128::from(tat.max(now));
    let inc = t * u128::from(cost);
    let new_tat = tat_w + inc;
    // allow_at = new_tat − τ; denied iff now < allow_at.
    let allowed = new_tat <= now_w + tau;
    let ttl = if allowed {
        new_tat - now_w
    } else {
        tat_w - now_w
    };
    let remaining = remaining(p, sat(ttl));
    Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.limit,
        remaining,
        retry_after: (!allowed && inc <= tau).then(|| dur(new_tat - tau - now_w)),
        reset_after: dur(ttl),
        quota_after: quota_after(p, sat(ttl), remaining),
        permit: None,
    }
}

/// How long until `remaining` grows by one, given the state's `ttl_ns`
/// (`tat − now`) and the `remaining` it gives: the first instant at which
/// `ttl' + (remaining + 1)·T ≤ τ`. For a denied unit request this is its
/// `retry_after`. Zero when `remaining` is already `limit`.
pub fn quota_after(p: &GcraParams, ttl_ns: u64, remaining: u64) -> Duration {
    if remaining >= p.limit || ttl_ns == 0 {
        return Duration::ZERO;
    }
    let ttl = u128::from(ttl_ns);
    let need = ttl + u128::from(p.emission_interval_ns) * (u128::from(remaining) + 1);
    dur(need.saturating_sub(u128::from(p.tolerance_ns)).min(ttl))
}

/// Units left after a decision whose state lies `ttl` ns ahead of now:
/// ⌊(τ − ttl) / T⌋ in exact nanoseconds, or, for
/// [`Policy::cell`](crate::Policy::cell), redis-cell 0.5.0's own formula — both terms
/// truncated to whole microseconds, divided in `f64` and truncated — so its
/// replies match `CL.THROTTLE`'s to the bit.
#[inline(always)]
pub(crate) fn remaining(p: &GcraParams, ttl: u64) -> u64 {
    let next = p.tolerance_ns.saturating_sub(ttl);
    if p.cell.is_none() {
        return next / p.emission_interval_ns;
    }
    cell_remaining(next, p.emission_interval_ns)
}

/// redis-cell's `(next.whole_microseconds() as f64 /
/// emission_interval.whole_microseconds() as f64) as i64` for `next ≥ 0`
/// (a negative `next`, reachable only from another policy's state, gives 0
/// or −1 there and 0 here). A T below one microsecond is the one departure:
/// redis-cell divides by zero there and answers `i64::MAX` (or 0); the
/// exact nanosecond quotient is reported instead, never above the limit.
#[cold]
fn cell_remaining(next_ns: u64, t_ns: u64) -> u64 {
    if t_ns < 1000 {
        return next_ns / t_ns;
    }
    let q = (next_ns / 1000) as f64 / (t_ns / 1000) as f64;
    u64::try_from(q as i64).unwrap_or(0)
}

/// Reads a decision made by a reservation — a check against the same policy
/// with its tolerance stretched by `extra_ns` — in the real policy's terms:
/// the decision the policy reports, and how long the admitted request must
/// wait for its slot.
pub fn rebase(p: &GcraParams, extra_ns: u64, d: Decision) -> (Decision, Duration) {
    let ttl = u64::try_from(d.reset_after.as_nanos()).unwrap_or(u64::MAX);
    let remaining = remaining(p, ttl);
    let d = Decision {
        quota_after: quota_after(p, ttl, remaining),
        ..d
    };
    if d.allowed {
        let wait = Duration::from_nanos(ttl.saturating_sub(p.tolerance_ns));
        (Decision { remaining, ..d }, wait)
    } else {
        let retry_after = d
            .retry_after
            .map(|r| r.saturating_add(Duration::from_nanos(extra_ns)));
        let d = Decision {
            remaining,
            retry_after,
            ..d
        };
        (d, Duration::ZERO)
    }
}

/// Whether [`check`] allows `cost` units at `now`, and if so the state
/// [`admit`] gives: the admission alone, for callers that read nothing else
/// of an allowed decision (the same u64 fast path, then the exact one).
#[inline(always)]
pub(crate) fn admits(p: &GcraParams, tat: u64, now: u64, cost: u64) -> Option<u64> {
    let (t, tau) = (p.emission_interval_ns, p.tolerance_ns);
    if let (Some(inc), Some(horizon)) = (t.checked_mul(cost), now.checked_add(tau)) {
        if let Some(new_tat) = tat.max(now).checked_add(inc) {
            return (new_tat <= horizon).then_some(new_tat);
        }
    }
    admits_wide(p, tat, now, cost)
}

#[cold]
fn admits_wide(p: &GcraParams, tat: u64, now: u64, cost: u64) -> Option<u64> {
    check_wide(p, tat, now, cost)
        .allowed
        .then(|| admit(p, tat, now, cost))
}

/// The new `tat` after admitting `cost` units; call only when [`check`] allowed.
#[inline]
pub fn admit(p: &GcraParams, tat: u64, now: u64, cost: u64) -> u64 {
    let inc = u128::from(p.emission_interval_ns) * u128::from(cost);
    sat(u128::from(tat.max(now)) + inc)
}

/// Gives a charge's units back: moves `tat` earlier by the charge's debt
/// (`units·T`) less the time since it was taken, and never before `now`
/// (a refund cannot bank quota beyond a fresh state).
///
/// Why less the time held: the state is one number, and the refunds of
/// other charges move the whole queue of debt, so a charge's own place in
/// it is not known later. But however the queue moved, the charge's debt
/// still runs at least `units·T` past its instant: giving back what of
/// that lies after `now` never returns more than the charge still holds,
/// so no sequence of refunds lets more through than the limit.
pub fn refund(p: &GcraParams, tat: u64, now: u64, r: &Receipt) -> u64 {
    let charged = u128::from(p.emission_interval_ns) * u128::from(r.units());
    let held = u128::from(now.saturating_sub(r.at_ns()));
    let back = charged.saturating_sub(held);
    sat(u128::from(tat).saturating_sub(back).max(u128::from(now)))
}

/// When the state `tat` becomes indistinguishable from a fresh key.
#[inline]
pub fn expires_at(tat: u64) -> u64 {
    tat
}
