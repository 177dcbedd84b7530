//! The direct API: rate limiting without HTTP.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use crate::decision::{Decision, PermitId};
use crate::policy::Policy;
use crate::store::{MemoryStore, Rule, RuleSpec, Store, StoreError};

/// One policy over a store, checked by key: the seeds' `is_action_allowed`.
///
/// Clones share the store.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let posts = Limiter::new(MemoryStore::new(), Policy::cell(15, 30, Duration::from_secs(60))?)
///     .with_prefix("post");
/// let d = posts.check("laoqian").await?;
/// assert_eq!(d.to_cell_reply(), [0, 16, 15, -1, 2]);
/// posts.refund("laoqian", 1).await?;          // the post failed: give the unit back
/// assert_eq!(posts.peek("laoqian").await?.remaining, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Limiter<S = MemoryStore> {
    store: Arc<S>,
    policy: Policy,
    prefix: Option<Box<[u8]>>,
}

impl<S> Clone for Limiter<S> {
    fn clone(&self) -> Self {
        Limiter {
            store: self.store.clone(),
            policy: self.policy,
            prefix: self.prefix.clone(),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter applying `policy` to keys in `store`.
    ///
    /// # Panics
    ///
    /// When the store cannot run `policy` ([`Store::validate`]; for example
    /// a sliding log above 10,000 on Redis): a configuration error, reported
    /// here rather than by every check. [`Limiter::try_new`] returns it.
    pub fn new(store: S, policy: Policy) -> Self {
        Self::from_shared(Arc::new(store), policy)
    }

    /// [`Limiter::new`], returning the store's refusal of `policy` instead
    /// of panicking (for policies read from configuration).
    pub fn try_new(store: S, policy: Policy) -> Result<Self, StoreError> {
        Self::try_from_shared(Arc::new(store), policy)
    }

    /// A limiter over a store shared with other limiters.
    ///
    /// # Panics
    ///
    /// As [`Limiter::new`].
    pub fn from_shared(store: Arc<S>, policy: Policy) -> Self {
        match Self::try_from_shared(store, policy) {
            Ok(l) => l,
            Err(e) => panic!(
                "rate-limit policy {:?} cannot run on this store: {e}",
                policy.algorithm()
            ),
        }
    }

    /// [`Limiter::from_shared`], returning the store's refusal of `policy`.
    pub fn try_from_shared(store: Arc<S>, policy: Policy) -> Result<Self, StoreError> {
        store.validate(&[RuleSpec::new(&policy, b"")])?;
        Ok(Limiter {
            store,
            policy,
            prefix: None,
        })
    }

    /// Prepends `prefix:` to every key, so several limiters can share a store
    /// (like the `@EntryTimes` annotation's prefix).
    pub fn with_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        let mut p = prefix.as_ref().to_vec();
        p.push(b':');
        self.prefix = Some(p.into_boxed_slice());
        self
    }

    /// The policy applied.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    fn full_key<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        match &self.prefix {
            None => Cow::Borrowed(key),
            Some(p) => Cow::Owned([&p[..], key].concat()),
        }
    }

    /// Charges one unit to `key`.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, StoreError> {
        self.check_n(key, 1).await
    }

    /// Charges `cost` units to `key`; denied (consuming nothing) if they do not fit.
    ///
    /// For a concurrency policy an admitted check holds a permit until
    /// [`Limiter::release`] or the lease ends; prefer [`Limiter::acquire`].
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, StoreError> {
        let key = self.full_key(key.as_ref());
        self.store.check(Rule::new(&key, &self.policy, cost)).await
    }

    /// What a one-unit check would see, without changing anything.
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, StoreError> {
        self.check_n(key, 0).await
    }

    /// Forgets `key`: its next check starts fresh.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = self.full_key(key.as_ref());
        self.store.reset(&key, &self.policy).await
    }

    /// Gives `amount` units back to `key` (never more than a fresh state holds).
    pub async fn refund(&self, key: impl AsRef<[u8]>, amount: u64) -> Result<(), StoreError> {
        let key = self.full_key(key.as_ref());
        self.store.refund(&key, &self.policy, amount).await
    }

    /// Releases a permit returned in [`Decision::permit`].
    pub async fn release(&self, key: impl AsRef<[u8]>, permit: PermitId) -> Result<(), StoreError> {
        let key = self.full_key(key.as_ref());
        self.store.release(&key, &self.policy, permit).await
    }

    /// Takes a concurrency permit, released when the returned guard drops.
    /// `Ok(Err(decision))` when denied.
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<Result<Permit<S>, Decision>, StoreError> {
        let key = self.full_key(key.as_ref()).into_owned();
        let decision = self.store.check(Rule::new(&key, &self.policy, 1)).await?;
        if !decision.allowed {
            return Ok(Err(decision));
        }
        Ok(Ok(Permit {
            store: self.store.clone(),
            policy: self.policy,
            key,
            id: decision.permit,
            decision,
        }))
    }
}

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

/// Runs `fut` to completion without awaiting it: inline if it finishes on the
/// first poll (memory store), else on the current tokio runtime if any.
pub(crate) fn release_detached<F: Future<Output = ()> + Send + 'static>(fut: F) {
    let mut fut = Box::pin(fut);
    let mut cx = Context::from_waker(Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(fut);
        }
    }
}
