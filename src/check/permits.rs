//! Concurrency permits held by an admitted request.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Holds, LayerState, Plan};
use crate::decision::PermitId;
use crate::info::RateLimitInfo;
use crate::policy::Policy;
use crate::store::release_detached;
use crate::store::Store;

/// Concurrency permits held while the inner service runs; released on drop
/// (completion or cancellation). The drop records the hold time for the
/// layer's retry estimate and, once the store released the permits, wakes
/// the layer's requests waiting for a permit of the same keys.
pub(crate) struct HeldPermits<St: Store> {
    store: Arc<St>,
    holds: Arc<Holds>,
    since: Instant,
    /// Key, policy, permit and the rule's index.
    held: Vec<(Vec<u8>, Policy, PermitId, usize)>,
}

impl<St: Store> HeldPermits<St> {
    pub(super) fn collect(
        shared: &LayerState<St>,
        plan: &Plan,
        info: &RateLimitInfo,
    ) -> Option<Self> {
        let held: Vec<_> = plan
            .actives()
            .iter()
            .zip(info.iter())
            .filter_map(|(a, (_, policy, d))| {
                Some((plan.key(a).to_vec(), *policy, d.permit?, a.rule))
            })
            .collect();
        (!held.is_empty()).then(|| HeldPermits {
            store: shared.store.clone(),
            holds: shared.holds.clone(),
            since: Instant::now(),
            held,
        })
    }
}

impl<St: Store> Drop for HeldPermits<St> {
    fn drop(&mut self) {
        let store = self.store.clone();
        let holds = self.holds.clone();
        let held = std::mem::take(&mut self.held);
        let elapsed = self.since.elapsed();
        for (_, _, _, rule) in &held {
            holds.observe(*rule, elapsed);
        }
        release_detached(async move {
            for (key, policy, id, _) in &held {
                // A failed release is covered by the permit's lease.
                let _ = store.release(key, policy, *id).await;
            }
            // After the store released them: a woken waiter finds them free.
            holds.notify_released(held.iter().map(|(key, ..)| &key[..]));
        });
    }
}
