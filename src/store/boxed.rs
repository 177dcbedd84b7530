//! A store chosen at run time: [`BoxStore`].
//!
//! [`Store`] returns `impl Future` from its methods, so `dyn Store` does not
//! exist (E0038). [`BoxStore`] erases the type instead: it holds any store
//! behind an `Arc` of a dyn-compatible twin of the trait whose methods return
//! boxed futures, and implements [`Store`] itself, so it goes wherever a store
//! does ([`ThrottleLayer`](crate::ThrottleLayer), [`Limiter`](crate::Limiter)).
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_throttle::store::BoxStore;
//! use tower_throttle::{Limiter, MemoryStore, Policy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = match std::env::var("REDIS_URL") {
//! #   #[cfg(feature = "redis")]
//!     Ok(url) => BoxStore::new(
//!         tower_throttle::RedisStore::builder().connect(url.as_str()).await?,
//!     ),
//! #   #[cfg(not(feature = "redis"))]
//! #   Ok(_) => unreachable!(),
//!     Err(_) => BoxStore::new(MemoryStore::new()),
//! };
//! let replies = Limiter::new(store, Policy::sliding_log(5, Duration::from_secs(60))?);
//! # let _ = replies;
//! # Ok(())
//! # }
//! ```
//!
//! # Cost
//!
//! An answer the store gives at once ([`Answer::Now`], every answer of the
//! memory store) comes through the vtable without boxing: an in-process
//! store decides through a `BoxStore` at the price of one indirect call. A
//! future ([`Answer::Later`], refunds, resets) is boxed: one small
//! allocation, negligible next to a network round trip.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// [`Store`] with boxed futures: dyn-compatible. Implemented for every store.
trait DynStore: Send + Sync + 'static {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<BoxFuture<'a, Result<Decisions, StoreError>>>;
    fn check<'a>(&'a self, charge: Charge<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;
    fn refund<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn reset<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn release<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
        permit: PermitId,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError>;
    fn reserves_slots(&self) -> bool;
    fn namespaces(&self) -> Option<&Namespaces>;
}

impl<S: Store> DynStore for S {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<BoxFuture<'a, Result<Decisions, StoreError>>> {
        match Store::decide(self, charges) {
            Answer::Now(result) => Answer::Now(result),
            Answer::Later(future) => Answer::Later(Box::pin(future)),
        }
    }

    fn check<'a>(&'a self, charge: Charge<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(Store::check(self, charge))
    }

    fn refund<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::refund(self, key, policy, receipt))
    }

    fn reset<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::reset(self, key, policy))
    }

    fn release<'a>(
        &'a self,
        key: &'a [u8],
        policy: &'a Policy,
        permit: PermitId,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::release(self, key, policy, permit))
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        Store::validate(self, rules)
    }

    fn reserves_slots(&self) -> bool {
        Store::reserves_slots(self)
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        Store::namespaces(self)
    }
}

/// Any [`Store`], its type erased: pick memory or Redis at startup without
/// making the rest of the program generic. See the [module docs](self).
///
/// Clones share the store.
#[derive(Clone)]
pub struct BoxStore {
    inner: Arc<dyn DynStore>,
}

impl BoxStore {
    /// Erases `store`'s type.
    pub fn new<S: Store>(store: S) -> Self {
        BoxStore {
            inner: Arc::new(store),
        }
    }

    /// Erases the type of a store already shared, without another `Arc`.
    pub fn from_arc<S: Store>(store: Arc<S>) -> Self {
        BoxStore { inner: store }
    }
}

impl fmt::Debug for BoxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxStore").finish_non_exhaustive()
    }
}

impl Store for BoxStore {
    #[inline]
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        self.inner.decide(charges)
    }

    // The store's own `check`, which may be cheaper than `decide`'s.
    async fn check(&self, charge: Charge<'_>) -> Result<Decision, StoreError> {
        self.inner.check(charge).await
    }

    // `async fn`, not the boxed future itself: the future's type then names
    // the borrows of `self` and of the arguments apart (a bare boxed future
    // would need one lifetime shorter than both, which `impl Future` cannot
    // name).
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        self.inner.refund(key, policy, receipt).await
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.inner.release(key, policy, permit).await
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.inner.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.inner.reserves_slots()
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        self.inner.namespaces()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    // Not `super::*`: the private twin trait would make every call ambiguous.
    use super::BoxStore;
    use crate::clock::ManualClock;
    use crate::policy::Policy;
    use crate::store::MemoryStore;
    use crate::store::{AtOnce, Charge, Store};

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn boxed_memory_store_decides_like_the_store_itself() {
        let clock = ManualClock::new();
        let plain = MemoryStore::builder().clock(clock.clone()).build();
        let boxed = BoxStore::new(MemoryStore::builder().clock(clock.clone()).build());
        let p = Policy::cell(2, 1, Duration::from_secs(1)).unwrap();
        block_on(async {
            let mut receipts = None;
            for i in 0..6 {
                let rule = Charge::new(b"k", &p, 1);
                let a = Store::check(&plain, rule).await.unwrap();
                let b = Store::check(&boxed, rule).await.unwrap();
                assert_eq!(a, b, "check {i}");
                if let (Some(ra), Some(rb)) = (a.receipt(), b.receipt()) {
                    receipts = Some((ra, rb));
                }
                let (ra, rb) = (plain.at_once(rule), boxed.at_once(rule));
                assert_eq!(ra.unwrap().unwrap(), rb.unwrap().unwrap(), "at once {i}");
            }
            clock.advance(Duration::from_secs(1));
            let (ra, rb) = receipts.expect("admitted checks");
            Store::refund(&boxed, b"k", &p, &rb).await.unwrap();
            plain.refund(b"k", &p, &ra).await.unwrap();
            let rules = [Charge::new(b"k", &p, 1), Charge::new(b"j", &p, 3)];
            assert_eq!(
                plain.check_all(&rules).await.unwrap(),
                Store::check_all(&boxed, &rules).await.unwrap()
            );
            Store::reset(&boxed, b"k", &p).await.unwrap();
            assert_eq!(
                Store::check(&boxed, Charge::new(b"k", &p, 0))
                    .await
                    .unwrap()
                    .remaining,
                3
            );
        });
    }

    #[test]
    fn answers_at_once_and_namespaces_are_forwarded() {
        let boxed = BoxStore::new(MemoryStore::new());
        let p = Policy::concurrency(1).unwrap();
        let d = boxed
            .at_once(Charge::new(b"c", &p, 1))
            .expect("at once")
            .unwrap();
        assert!(d.allowed);
        let again = boxed
            .all_at_once(&[Charge::new(b"c", &p, 1)])
            .expect("at once");
        assert!(!again.unwrap()[0].allowed, "the permit is held");
        block_on(Store::release(&boxed, b"c", &p, d.permit.unwrap())).unwrap();
        let d = boxed.at_once(Charge::new(b"c", &p, 1)).expect("at once");
        assert!(d.unwrap().allowed);
        assert!(Store::namespaces(&boxed).is_some());
    }
}
