//! Receipts: where each admitted charge was taken (see [`Receipt`]).

use crate::decision::{Decision, Receipt};

use super::{Algorithm, Policy};

impl Policy {
    /// The receipt of a charge of `cost` units that this policy decided as
    /// `d` at `now_ns` on the deciding store's clock: `None` unless it was
    /// admitted and took at least one unit. Every store derives its
    /// receipts here, from the decision's own figures, so that all of them
    /// name the same slot for the same charge.
    #[inline]
    pub fn receipt(&self, d: &Decision, now_ns: u64, cost: u64) -> Option<Receipt> {
        if !d.allowed || cost == 0 {
            return None;
        }
        let until_ns = match self.algorithm() {
            // An admitted GCRA charge's ttl is its new tat − now.
            Algorithm::Gcra(_) => {
                now_ns.saturating_add(u64::try_from(d.reset_after.as_nanos()).unwrap_or(u64::MAX))
            }
            Algorithm::SlidingLog(_)
            | Algorithm::FixedWindow(_)
            | Algorithm::SlidingWindow(_)
            | Algorithm::Concurrency(_) => now_ns,
        };
        let receipt = Receipt::new(cost, now_ns, until_ns, d.permit).decided_by(d.decided_by);
        Some(receipt)
    }

    /// `d` with its receipt (see [`Policy::receipt`]).
    #[inline]
    pub fn stamp(&self, mut d: Decision, now_ns: u64, cost: u64) -> Decision {
        d.receipt = self.receipt(&d, now_ns, cost);
        d
    }
}
