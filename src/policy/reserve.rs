//! Reservations: delay mode and `Limiter::wait` admit a GCRA request at a
//! slot in the future by checking it against a stretched policy, then turn
//! the decision back into the real policy's terms.

use std::time::Duration;

use super::{Algorithm, GcraParams, Policy};
use crate::algorithm::gcra;

impl Policy {
    /// For GCRA, the same policy with its tolerance stretched by `extra`
    /// (rounded down to whole microseconds, so every store accepts it): a
    /// check against it admits a request whose slot is up to `extra` in the
    /// future — a reservation — and updates the key's state exactly as an
    /// admission at that slot would. `None` for other algorithms.
    pub(crate) fn reserving(&self, extra: Duration) -> Option<Policy> {
        let Algorithm::Gcra(p) = self.algorithm else {
            return None;
        };
        let extra_ns = u64::try_from(extra.as_nanos()).ok()?;
        let tolerance_ns = p.tolerance_ns.checked_add(extra_ns - extra_ns % 1000)?;
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
