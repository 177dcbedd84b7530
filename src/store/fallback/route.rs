//! Which store decides a call: the primary, as the probe when the fallback
//! has decided alone for the probe interval, or the fallback; and the
//! primary's share of a caller's budget.

use super::FallbackShared;
use crate::store::budget;
use crate::store::probe::{Probe, ProbeGuard};
use crate::store::StoreError;

/// Where a call goes.
pub(super) enum Route<'a> {
    /// To the primary; as the probe, with its turn, which the call holds to
    /// its end (dropped included).
    Primary(Option<ProbeGuard<'a>>),
    Fallback,
}

impl FallbackShared {
    /// Where the next call goes; a probe's turn is held by the call.
    pub(super) fn route(&self) -> Route<'_> {
        match self.gate.try_probe(&*self.clock) {
            Probe::Closed => Route::Primary(None),
            Probe::Wait => Route::Fallback,
            Probe::Mine(turn) => Route::Primary(Some(turn)),
        }
    }

    /// Opens the fallback for the probe interval (and logs the switch).
    pub(super) fn primary_failed(&self, e: &StoreError) {
        if self.gate.open_for(&*self.clock, self.probe_interval) {
            tracing::warn!(target: "tower_throttle", error = %e,
                "rate-limit store unavailable: the fallback store decides until it answers again");
        }
    }

    /// Hands every call back to the primary (and logs the switch).
    pub(super) fn primary_answered(&self) {
        if self.gate.close() {
            tracing::warn!(target: "tower_throttle",
                "rate-limit store answers again: back from the fallback store");
        }
    }
}

/// The primary's part of what is left of the caller's budget, in quarters:
/// the last quarter is the fallback's.
const PRIMARY_QUARTERS: u32 = 3;

/// Runs a primary call within [`PRIMARY_QUARTERS`] of what is left of the
/// caller's budget (a layer's `store_timeout`), if it set one: past that the
/// call fails with [`StoreError::Timeout`] and the fallback answers, before
/// the caller gives up on the whole call.
pub(super) async fn within_share<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let Some(end) = budget::deadline() else {
        return call.await;
    };
    let now = tokio::time::Instant::now();
    let share = end.saturating_duration_since(now) * PRIMARY_QUARTERS / 4;
    budget::until(now + share, share, call).await
}
