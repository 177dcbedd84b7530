//! The direct API: rate limiting without HTTP.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::policy::{effective_policy, rebase};
use crate::store::{Charge, MemoryStore, RuleSpec, Store, StoreError};

/// How many times a delayed request (the layer's delay mode, `wait` on
/// other algorithms than GCRA) is checked again before giving up.
pub const MAX_DELAY_ATTEMPTS: u32 = 8;

/// A rule name: 1 to 64 of `[A-Za-z0-9_.-]` (it is part of store keys and
/// of the `RateLimit` fields, so nothing in it needs escaping).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// One policy over a store, checked by key: the classic `is_action_allowed`.
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
/// // The post failed: give its unit back, where it was taken.
/// posts.refund("laoqian", &d.receipt().expect("admitted")).await?;
/// assert_eq!(posts.peek("laoqian").await?.remaining, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Limiter<S = MemoryStore> {
    store: Arc<S>,
    policy: Policy,
    prefix: KeyPrefix,
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
            prefix: KeyPrefix::default(),
        })
    }

    /// Prepends `prefix:` to every key, so several limiters can share a store
    /// (like the `@EntryTimes` annotation's prefix).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = KeyPrefix::new(prefix.as_ref());
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
        self.prefix.apply(key)
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
        self.store
            .check(Charge::new(&key, &self.policy, cost))
            .await
    }

    /// Charges `cost` units of `policy` to `key`: a policy chosen per call
    /// (a customer's tier). `key`'s state is shared with this limiter's
    /// own policy as described in [`crate::resolve`]: carried over for GCRA,
    /// sliding logs, concurrency and windows of the same length, separate
    /// otherwise. Refund, reset and release such a check with the `_with`
    /// variants and the same policy.
    pub async fn check_with(
        &self,
        key: impl AsRef<[u8]>,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let key = self.key_for(key.as_ref(), policy);
        self.store.check(Charge::new(&key, policy, cost)).await
    }

    /// [`Limiter::refund`] of a [`Limiter::check_with`].
    pub async fn refund_with(
        &self,
        key: impl AsRef<[u8]>,
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        let key = self.key_for(key.as_ref(), policy);
        self.store.refund(&key, policy, receipt).await
    }

    /// [`Limiter::reset`] of a [`Limiter::check_with`].
    pub async fn reset_with(
        &self,
        key: impl AsRef<[u8]>,
        policy: &Policy,
    ) -> Result<(), StoreError> {
        let key = self.key_for(key.as_ref(), policy);
        self.store.reset(&key, policy).await
    }

    /// The full key of `key` under `policy`: tagged when its state cannot
    /// be shared with the limiter's own policy (`prefix~f60000000000:key`).
    fn key_for<'k>(&self, key: &'k [u8], policy: &Policy) -> Cow<'k, [u8]> {
        let mut tag = Vec::new();
        if !policy.write_state_tag(&self.policy, &mut tag) {
            return self.full_key(key);
        }
        let mut out = Vec::with_capacity(tag.len() + key.len() + 16);
        out.extend_from_slice(self.prefix.name());
        out.extend_from_slice(&tag);
        out.push(b':');
        out.extend_from_slice(key);
        Cow::Owned(out)
    }

    /// Waits up to `max_wait` for one unit, then takes it: Guava's
    /// `tryAcquire(timeout)`. See [`Limiter::wait_n`].
    pub async fn wait(
        &self,
        key: impl AsRef<[u8]>,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        self.wait_n(key, 1, max_wait).await
    }

    /// Waits up to `max_wait` for `cost` units, then takes them; returns the
    /// admitting decision, or at once the denial when they cannot come
    /// within `max_wait` (nothing consumed, nothing slept).
    ///
    /// GCRA reserves the request's slot in the key's state at once, as the
    /// layer's delay mode does, then sleeps until it: waiters queue in
    /// order instead of racing when quota returns, and a waiter dropped
    /// before its slot gives it back. Other algorithms, and stores that
    /// cannot reserve ([`Store::reserves_slots`]: `CellStore`,
    /// `GovernorStore`), check again after each `retry_after`, within the
    /// budget (a competing caller may take the quota first). Needs a tokio
    /// runtime with time enabled.
    pub async fn wait_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        let key = self.full_key(key.as_ref()).into_owned();
        let real = self.policy;
        let mut waited = Duration::ZERO;
        let mut attempts = 0;
        loop {
            let left = max_wait.saturating_sub(waited);
            // A store that cannot reserve is asked the real policy, and the
            // loop checks again after each denial's wait.
            let reserve = self.store.reserves_slots().then_some(left);
            let used = effective_policy(&real, cost, reserve);
            let mut decision = self.store.check(Charge::new(&key, &used, cost)).await?;
            let slot = rebase(&real, &used, &mut decision);
            if decision.allowed {
                if let Some(receipt) = decision.receipt().filter(|_| !slot.is_zero()) {
                    let reserved = Reservation {
                        store: Some(self.store.clone()),
                        key: &key,
                        policy: real,
                        receipt,
                    };
                    tokio::time::sleep(slot).await;
                    reserved.keep();
                }
                return Ok(decision);
            }
            match decision.retry_after {
                Some(retry) if retry <= left && attempts < MAX_DELAY_ATTEMPTS => {
                    attempts += 1;
                    let retry = retry.max(Duration::from_millis(1));
                    tokio::time::sleep(retry).await;
                    waited += retry;
                }
                _ => return Ok(decision),
            }
        }
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

    /// Gives an admitted check's units back to `key`, into the slot where
    /// they were taken ([`Decision::receipt`]; [`Receipt::part`] for some
    /// of them): a charge whose window has ended, or whose GCRA debt is
    /// already paid off, gives nothing back, so a refund never lets more
    /// through than the limit. See [`Store::refund`].
    pub async fn refund(&self, key: impl AsRef<[u8]>, receipt: &Receipt) -> Result<(), StoreError> {
        let key = self.full_key(key.as_ref());
        self.store.refund(&key, &self.policy, receipt).await
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
        let decision = self.store.check(Charge::new(&key, &self.policy, 1)).await?;
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

/// A slot reserved by [`Limiter::wait_n`]: refunded if the waiter is
/// dropped before it.
struct Reservation<'k, S: Store> {
    store: Option<Arc<S>>,
    key: &'k [u8],
    policy: Policy,
    receipt: Receipt,
}

impl<S: Store> Reservation<'_, S> {
    fn keep(mut self) {
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

/// The `prefix:` the direct limiters put before every key.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyPrefix(Option<Box<[u8]>>);

impl KeyPrefix {
    /// `prefix` followed by `:`.
    pub(crate) fn new(prefix: &[u8]) -> Self {
        KeyPrefix(Some([prefix, b":"].concat().into_boxed_slice()))
    }

    /// `prefix:key`, or `key` without a prefix.
    pub(crate) fn apply<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        match &self.0 {
            None => Cow::Borrowed(key),
            Some(p) => Cow::Owned([&p[..], key].concat()),
        }
    }

    /// `prefix:` (empty without a prefix).
    pub(crate) fn with_colon(&self) -> &[u8] {
        self.0.as_deref().unwrap_or_default()
    }

    /// `prefix` without its `:` (empty without a prefix).
    pub(crate) fn name(&self) -> &[u8] {
        let p = self.with_colon();
        &p[..p.len().saturating_sub(1)]
    }
}
