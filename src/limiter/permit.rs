//! Guards that give back what a limiter took when they drop.

use std::sync::Arc;

use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::store::release_detached;
use crate::store::{Store, StoreError};

/// A held concurrency permit; dropping it releases it.
///
/// Release on drop is immediate for the memory store. For a remote store it is
/// spawned on the current tokio runtime; without one the lease frees it.
#[derive(Debug)]
pub struct Permit<S: Store> {
    store: Arc<S>,
    policy: Policy,
    key: Vec<u8>,
    id: Option<PermitId>,
    decision: Decision,
}

impl<S: Store> Permit<S> {
    pub(super) fn new(store: Arc<S>, policy: Policy, key: Vec<u8>, decision: Decision) -> Self {
        Permit {
            store,
            policy,
            key,
            id: decision.permit,
            decision,
        }
    }

    /// The decision that granted the permit.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// Releases now and waits for the store to confirm.
    pub async fn release(mut self) -> Result<(), StoreError> {
        match self.id.take() {
            Some(id) => self.store.release(&self.key, &self.policy, id).await,
            None => Ok(()),
        }
    }
}

impl<S: Store> Drop for Permit<S> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let (store, policy, key) = (
            self.store.clone(),
            self.policy,
            std::mem::take(&mut self.key),
        );
        release_detached(async move {
            // A failed release is covered by the lease.
            let _ = store.release(&key, &policy, id).await;
        });
    }
}

/// Charges taken for a waiter's reserved slot ([`Limiter::wait_n`], the
/// layer's delay mode): refunded, each into the slot its receipt names, if
/// the waiter is dropped before its time (a client that hangs up), so
/// abandoned waiters do not push later requests back.
///
/// [`Limiter::wait_n`]: super::Limiter::wait_n
pub(crate) struct Reservation<S: Store> {
    store: Option<Arc<S>>,
    charged: Vec<(Vec<u8>, Policy, Receipt)>,
}

impl<S: Store> Reservation<S> {
    pub(crate) fn new(store: Arc<S>, charged: Vec<(Vec<u8>, Policy, Receipt)>) -> Self {
        Reservation {
            store: Some(store),
            charged,
        }
    }

    /// The waiter reached its slot: the charges stand.
    pub(crate) fn keep(mut self) {
        self.store = None;
    }
}

impl<S: Store> Drop for Reservation<S> {
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
