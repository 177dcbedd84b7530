//! Concurrency permits held by an admitted request.

use std::sync::Arc;

use super::{Plan, Shared};
use crate::decision::PermitId;
use crate::info::RateLimitInfo;
use crate::limiter::release_detached;
use crate::policy::Policy;
use crate::store::Store;

/// Concurrency permits held while the inner service runs; released on drop
/// (completion or cancellation).
pub(crate) struct Permits<St: Store> {
    store: Arc<St>,
    held: Vec<(Vec<u8>, Policy, PermitId)>,
}

impl<St: Store> Permits<St> {
    pub(super) fn collect(shared: &Shared<St>, plan: &Plan, info: &RateLimitInfo) -> Option<Self> {
        let held: Vec<_> = plan
            .actives()
            .iter()
            .zip(info.iter())
            .filter_map(|(a, (_, policy, d))| Some((plan.key(a).to_vec(), *policy, d.permit?)))
            .collect();
        (!held.is_empty()).then(|| Permits {
            store: shared.store.clone(),
            held,
        })
    }
}

impl<St: Store> Drop for Permits<St> {
    fn drop(&mut self) {
        let store = self.store.clone();
        let held = std::mem::take(&mut self.held);
        release_detached(async move {
            for (key, policy, id) in held {
                // A failed release is covered by the permit's lease.
                let _ = store.release(&key, &policy, id).await;
            }
        });
    }
}
