//! Reservations: delay mode and `Limiter::wait` admit a GCRA request at a
//! slot in the future by checking it against a stretched policy, then turn
//! the decision back into the real policy's terms.

use std::time::Duration;

use super::{Algorithm, GcraParams, Policy};
use crate::algorithm::gcra;

/// The longest tolerance a reservation stretches a GCRA policy to: the
/// longest every store runs (Redis reads a tat within 1000·2^42 ns of now).
/// A wait longer than that reserves this far and checks again for the rest.
pub(crate) const MAX_RESERVED_TOLERANCE_NS: u64 = (1000 << 42) - 1;

impl Policy {
    /// For GCRA, the same policy with its tolerance stretched by `extra`
    /// (rounded down to whole microseconds), up to
    /// [`MAX_RESERVED_TOLERANCE_NS`] (a policy already beyond it stays as
    /// it is): a check against it admits a request whose slot is up to
    /// `extra` in the future — a reservation — and updates the key's state
    /// exactly as an admission at that slot would. `None` for other
    /// algorithms.
    pub(crate) fn reserving(&self, extra: Duration) -> Option<Policy> {
        let Algorithm::Gcra(p) = self.algorithm else {
            return None;
        };
        let extra_ns = u64::try_from(extra.as_nanos()).unwrap_or(u64::MAX);
        let tolerance_ns = p
            .tolerance_ns
            .saturating_add(extra_ns - extra_ns % 1000)
            .min(MAX_RESERVED_TOLERANCE_NS.max(p.tolerance_ns));
        Some(Policy {
            algorithm: Algorithm::Gcra(GcraParams { tolerance_ns, ..p }),
        })
    }
}

/// The policy a rule is checked against. In delay mode a GCRA rule that can
/// ever fit reserves its slot within the remaining wait budget (see
/// [`Policy::reserving`]): waiters then queue behind each other in the key's
/// state instead of stampeding back to the store when the quota returns.
pub(crate) fn effective_policy(policy: &Policy, cost: u64, reserve: Option<Duration>) -> Policy {
    reserve
        .filter(|_| cost <= policy.limit())
        .and_then(|budget| policy.reserving(budget))
        .unwrap_or(*policy)
}

/// Turns a reservation's decision back into the real policy's terms; returns
/// how long the request must wait for its reserved slot.
pub(crate) fn rebase(real: &Policy, used: &Policy, decision: &mut crate::Decision) -> Duration {
    match (real.algorithm(), used.algorithm()) {
        (Algorithm::Gcra(p), Algorithm::Gcra(u)) if p != u => {
            let (d, wait) = gcra::rebase(p, u.tolerance_ns - p.tolerance_ns, *decision);
            *decision = d;
            wait
        }
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tolerance(p: Option<Policy>) -> u64 {
        match p.map(|p| *p.algorithm()) {
            Some(Algorithm::Gcra(g)) => g.tolerance_ns,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reservation_stretches_up_to_what_every_store_runs() {
        let day = Duration::from_secs(86_400);
        let month = Policy::cell(0, 1, 30 * day).unwrap();
        let tau = 30 * 86_400 * 1_000_000_000u64;
        // Within the bound: by the extra, rounded down to whole µs.
        let extra = Duration::from_nanos(1_999);
        assert_eq!(tolerance(month.reserving(extra)), tau + 1_000);
        assert_eq!(tolerance(month.reserving(Duration::ZERO)), tau);
        // Beyond it: up to it, whatever the extra.
        for extra in [25 * day, Duration::from_nanos(u64::MAX), Duration::MAX] {
            assert_eq!(tolerance(month.reserving(extra)), MAX_RESERVED_TOLERANCE_NS);
        }
        // A policy already beyond it (the memory store runs it) stays.
        let long = Policy::cell(0, 1, 60 * day).unwrap();
        assert_eq!(tolerance(long.reserving(day)), 60 * 86_400 * 1_000_000_000);
        assert!(Policy::fixed_window(1, day)
            .unwrap()
            .reserving(day)
            .is_none());
    }
}
