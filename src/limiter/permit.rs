//! Guards that give back what a limiter took when they drop.

use std::sync::Arc;

use super::release_detached;
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;
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

/// A slot reserved by [`Limiter::wait_n`](super::Limiter::wait_n):
/// refunded if the waiter is dropped before it.
pub(super) struct Reservation<'k, S: Store> {
    store: Option<Arc<S>>,
    key: &'k [u8],
    policy: Policy,
    receipt: Receipt,
}

impl<'k, S: Store> Reservation<'k, S> {
    pub(super) fn new(store: Arc<S>, key: &'k [u8], policy: Policy, receipt: Receipt) -> Self {
        Reservation {
            store: Some(store),
            key,
            policy,
            receipt,
        }
    }

    /// The waiter reached its slot: keep the charge.
    pub(super) fn keep(mut self) {
        self.store = None;
    }
}

impl<S: Store> Drop for Reservation<'_, S> {
    fn drop(&mut self) {
        let Some(store) = self.store.take() else {
            return;
        };
        let (key, policy, receipt) = (self.key.to_vec(), self.policy, self.receipt);
        release_detached(async move {
            // A failed refund leaves the slot taken: the limit still holds.
            let _ = store.refund(&key, &policy, &receipt).await;
        });
    }
}
