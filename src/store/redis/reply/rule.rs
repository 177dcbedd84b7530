//! One rule's part of a script reply rendered as a [`Decision`] by the
//! algorithms' own pure functions, and the stored state it carried.

use std::time::Duration;

use redis::Value;

use super::value::{bad, gcra_tat, ns, opt_uint, uint, us_dur};
use crate::algorithm::fixed_window::{self, FixedWindowState};
use crate::algorithm::gcra;
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::algorithm::{ConcurrencyParams, WindowParams};
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, Policy};
use crate::store::StoreError;

/// One rule as the check script saw it.
#[derive(Clone, Copy)]
pub(crate) struct SentRule<'a> {
    pub policy: &'a Policy,
    pub cost: u64,
    pub permit: Option<PermitId>,
}

/// The stored state a rule's reply carried, for the algorithms whose
/// decision is rendered from an O(1) state (see [`deny`](crate::store::redis::deny)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawState {
    /// GCRA's `tat`, in ns.
    Gcra(u64),
    /// A fixed-window counter.
    Fixed(FixedWindowState),
    /// A sliding-window counter.
    Sliding(SlidingWindowState),
}

impl RawState {
    /// The decision this state gives `policy` at `now_ns` for `cost`, or
    /// `None` if the state is not `policy`'s algorithm.
    pub(crate) fn decide(&self, policy: &Policy, now_ns: u64, cost: u64) -> Option<Decision> {
        match (self, policy.algorithm()) {
            (RawState::Gcra(tat), Algorithm::Gcra(p)) => Some(gcra::check(p, *tat, now_ns, cost)),
            (RawState::Fixed(s), Algorithm::FixedWindow(p)) => {
                Some(fixed_window::check(p, s, now_ns, cost))
            }
            (RawState::Sliding(s), Algorithm::SlidingWindow(p)) => {
                Some(sliding_window::check(p, s, now_ns, cost))
            }
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::Concurrency(_)) => None,
        }
    }
}

/// How many reply fields a rule of `policy` takes.
pub(super) fn width(policy: &Policy) -> usize {
    match policy.algorithm() {
        Algorithm::Gcra(_) => 2,
        Algorithm::FixedWindow(_) => 3,
        Algorithm::SlidingWindow(_) => 4,
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => 5,
    }
}

/// Renders one rule's reply fields at `now_ns`. For the O(1)-state
/// algorithms the script returns the stored state and the decision is
/// rendered by the same pure function the memory store runs; the script's
/// own verdict must agree.
pub(super) fn decision(
    rule: &SentRule<'_>,
    items: &[Value],
    now_ns: u64,
) -> Result<(Decision, Option<RawState>), StoreError> {
    let field = |i: usize| item(items, i);
    let script_allowed = match uint(field(0)?)? {
        0 => false,
        1 => true,
        n => return Err(bad(format!("verdict {n}"))),
    };
    let cost = rule.cost;
    let mut state = None;
    let d = match *rule.policy.algorithm() {
        Algorithm::Gcra(p) => {
            let tat = gcra_tat(uint(field(1)?)?, now_ns)?;
            state = Some(RawState::Gcra(tat));
            gcra::check(&p, tat, now_ns, cost)
        }
        Algorithm::FixedWindow(p) => {
            let s = FixedWindowState {
                window: uint(field(1)?)?,
                count: uint(field(2)?)?,
            };
            state = Some(RawState::Fixed(s));
            fixed_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingWindow(p) => {
            let s = SlidingWindowState {
                window: uint(field(1)?)?,
                current: uint(field(2)?)?,
                previous: uint(field(3)?)?,
            };
            state = Some(RawState::Sliding(s));
            sliding_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingLog(p) => sliding_log(&p, items, script_allowed)?,
        Algorithm::Concurrency(p) => Decision {
            permit: if script_allowed && cost > 0 {
                rule.permit
            } else {
                None
            },
            ..concurrency(&p, items, script_allowed)?
        },
    };
    if d.allowed != script_allowed {
        return Err(bad(format!(
            "the script decided {script_allowed} where the model decides {}",
            d.allowed
        )));
    }
    Ok((d, state))
}

/// Item `i` of a rule's reply.
fn item(items: &[Value], i: usize) -> Result<&Value, StoreError> {
    items
        .get(i)
        .ok_or_else(|| bad(format!("rule reply too short ({} items)", items.len())))
}

/// A sliding log's decision as its script reports it: in µs, or, for a
/// window not a whole number of µs (code 'L'), in whole µs plus the
/// window's ns remainder.
fn sliding_log(p: &WindowParams, items: &[Value], allowed: bool) -> Result<Decision, StoreError> {
    let field = |i: usize| item(items, i);
    let decision = Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.max,
        remaining: uint(field(1)?)?,
        retry_after: None,
        reset_after: Duration::ZERO,
        quota_after: Duration::ZERO,
        permit: None,
    };
    if p.window_ns.is_multiple_of(1000) {
        return Ok(Decision {
            retry_after: opt_uint(field(2)?)?.map(us_dur).transpose()?,
            reset_after: us_dur(uint(field(3)?)?)?,
            quota_after: us_dur(uint(field(4)?)?)?,
            ..decision
        });
    }
    // Whole µs m of 1000·m + W mod 1000 ns, or −1 for none.
    let left = |v: &Value| -> Result<Option<Duration>, StoreError> {
        opt_uint(v)?
            .map(|m| {
                ns(m)?
                    .checked_add(p.window_ns % 1000)
                    .map(Duration::from_nanos)
                    .ok_or_else(|| bad(format!("time {m} µs out of range")))
            })
            .transpose()
    };
    Ok(Decision {
        retry_after: left(field(2)?)?,
        reset_after: left(field(3)?)?.unwrap_or_default(),
        quota_after: left(field(4)?)?.unwrap_or_default(),
        ..decision
    })
}

/// A concurrency limit's decision as its script reports it (times in
/// ns, decimal strings: exact at any size), without its permit.
fn concurrency(
    p: &ConcurrencyParams,
    items: &[Value],
    allowed: bool,
) -> Result<Decision, StoreError> {
    let field = |i: usize| item(items, i);
    Ok(Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.max_in_flight,
        remaining: uint(field(1)?)?,
        retry_after: opt_uint(field(2)?)?.map(Duration::from_nanos),
        reset_after: Duration::from_nanos(uint(field(3)?)?),
        quota_after: Duration::from_nanos(uint(field(4)?)?),
        permit: None,
    })
}
