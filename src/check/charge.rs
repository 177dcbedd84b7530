//! Charges that may be given back: counting by outcome (a request is
//! charged when admitted, a reservation, and refunded once its response
//! shows it does not count), and the slot a delayed request reserved
//! (refunded if the request is dropped while it waits).

use std::sync::Arc;

use super::{LayerState, Plan};
use crate::decision::Receipt;
use crate::info::RateLimitInfo;
use crate::limiter::release_detached;
use crate::outcome::Outcome;
use crate::policy::Policy;
use crate::settings::CountIf;
use crate::store::Store;

/// The units an admitted request was charged, to refund if its response
/// does not count. Dropped without a response (the client went away, the
/// inner service's future was dropped), the charge stands: an attempt
/// whose outcome is unknown counts, so hanging up cannot dodge the limit.
pub(crate) struct HeldCharge<St: Store> {
    store: Arc<St>,
    count_if: CountIf,
    charged: Vec<(Vec<u8>, Policy, Receipt)>,
}

impl<St: Store> HeldCharge<St> {
    pub(super) fn collect(
        shared: &LayerState<St>,
        plan: &Plan,
        info: &RateLimitInfo,
    ) -> Option<Box<Self>> {
        let count_if = shared.settings.count_if.clone()?;
        let charged = plan.refundable(info);
        (!charged.is_empty()).then(|| {
            Box::new(HeldCharge {
                store: shared.store.clone(),
                count_if,
                charged,
            })
        })
    }

    /// Keeps the charge if a response of this `outcome` counts, else
    /// refunds it (at once for an in-process store; else on the current
    /// runtime).
    pub(crate) fn settle(self, outcome: Outcome) {
        if (self.count_if)(outcome) {
            return;
        }
        let HeldCharge { store, charged, .. } = self;
        release_detached(async move {
            for (key, policy, receipt) in charged {
                // Into the slot the unit was taken from (a window that has
                // ended since keeps it). A failed refund leaves the unit
                // counted: the limit holds.
                let _ = store.refund(&key, &policy, &receipt).await;
            }
        });
    }
}

/// The quota a delayed request was charged while it waits for its slot:
/// refunded if the request is dropped before it goes (a client that hangs
/// up), so abandoned waiters do not push later requests back. Concurrency
/// permits are not here: the verdict's permits release themselves.
pub(super) struct Reserved<St: Store> {
    store: Option<Arc<St>>,
    charged: Vec<(Vec<u8>, Policy, Receipt)>,
}

impl<St: Store> Reserved<St> {
    pub(super) fn new(shared: &LayerState<St>, plan: &Plan, info: Option<&RateLimitInfo>) -> Self {
        let charged = info.map(|info| plan.refundable(info)).unwrap_or_default();
        Reserved {
            store: Some(shared.store.clone()),
            charged,
        }
    }

    /// The request went ahead: its charge stands.
    pub(super) fn keep(mut self) {
        self.store = None;
    }
}

impl<St: Store> Drop for Reserved<St> {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let charged = std::mem::take(&mut self.charged);
        release_detached(async move {
            for (key, policy, receipt) in charged {
                // A failed refund leaves the slot taken: the limit still holds.
                let _ = store.refund(&key, &policy, &receipt).await;
            }
        });
    }
}
