//! Where limiter state lives.
//!
//! A [`Store`] evaluates rules atomically: one call, one answer, no lost or
//! double-counted request. [`MemoryStore`] is the default; the Redis stores
//! share one set of limits between app instances.

mod answer;
pub mod boxed;
pub(crate) mod budget;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod error;
pub mod fallback;
#[cfg(feature = "governor")]
pub mod governor;
pub mod hottest;
pub mod lease;
pub mod memory;
mod namespaces;
pub(crate) mod probe;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;

#[cfg(feature = "governor")]
pub use self::governor::GovernorStore;
#[cfg(feature = "redis")]
pub use self::redis::{CellStore, LazyRedisStore, RedisClusterStore, RedisStore};
#[cfg(test)]
pub(crate) use answer::AtOnce;
pub(crate) use answer::{release_detached, Reach};
pub use answer::{Answer, AnswerFuture, Decisions, LaterBox};
pub use boxed::BoxStore;
pub use error::{BoxError, Outage, StoreError};
pub use fallback::{FallbackStore, DEFAULT_PROBE_INTERVAL};
pub use hottest::Hottest;
pub use memory::{MemoryStore, MemoryStoreBuilder};
pub use namespaces::Namespaces;

use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;

/// One charge of a store call: `cost` units of `policy` against `key`
/// (a [`Rule`](crate::Rule) of a layer becomes one per request).
#[derive(Clone, Copy, Debug)]
pub struct Charge<'a> {
    /// The full key (already prefixed). Any bytes.
    pub key: &'a [u8],
    /// The limit to apply.
    pub policy: &'a Policy,
    /// Units to charge; 0 peeks without changing state.
    pub cost: u64,
    /// Lock-out state (a [`Penalty`](crate::lockout::Penalty)'s strikes
    /// or lock): a lock that was announced must hold, so a store that caps
    /// its keys never decides this key on state shared with other keys (the
    /// memory store's shared counters for new keys: it keeps such keys in a room of
    /// their own, see [`MemoryStoreBuilder::max_penalty_keys`]), and a
    /// [`FallbackStore`] keeps it in both of its stores.
    pub penalty: bool,
    /// Whether the caller reads an admission's figures (`remaining`,
    /// `reset_after`, `quota_after`); `true` unless
    /// [`Charge::without_figures`] says otherwise.
    pub figures: bool,
}

impl<'a> Charge<'a> {
    /// A charge of `cost` units of `policy` against `key`.
    pub fn new(key: &'a [u8], policy: &'a Policy, cost: u64) -> Self {
        Charge {
            key,
            policy,
            cost,
            penalty: false,
            figures: true,
        }
    }

    /// The same charge, for a caller that reads nothing of an admission but
    /// that it was one, its permit and its receipt: a store may leave an
    /// admission's `remaining`, `reset_after` and `quota_after` at 0 (the
    /// memory store does for GCRA, sparing their arithmetic). Denials are
    /// complete; every other answer is as without it.
    #[must_use]
    pub fn without_figures(self) -> Self {
        Charge {
            figures: false,
            ..self
        }
    }

    /// The same charge, of lock-out state (see [`Charge::penalty`]).
    #[must_use]
    pub fn of_penalty(self) -> Self {
        Charge {
            penalty: true,
            ..self
        }
    }
}

/// One rule of a layer or limiter as a store sees it before any traffic:
/// see [`Store::validate`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RuleSpec<'a> {
    /// The limit the rule applies.
    pub policy: &'a Policy,
    /// The bytes every key of the rule starts with (the layer's
    /// `prefix:rule-name:`, a limiter's `prefix:`), before the part taken
    /// from the request.
    pub key_head: &'a [u8],
}

impl<'a> RuleSpec<'a> {
    /// A rule applying `policy` to keys starting with `key_head`.
    pub fn new(policy: &'a Policy, key_head: &'a [u8]) -> Self {
        RuleSpec { policy, key_head }
    }
}

/// A place that keeps rate-limit state and decides atomically.
///
/// Every implementation follows the definitions in [`crate::algorithm`]; the
/// test suite holds each one to the same reference models (a store of your
/// own runs them through `store::conformance`, feature `conformance`).
///
/// A store author writes three methods: [`decide`](Store::decide),
/// [`refund`](Store::refund) and [`reset`](Store::reset). The others have
/// defaults: [`check`](Store::check) and [`check_all`](Store::check_all)
/// await `decide` (a wrapper forwards `decide` alone), `release` is a
/// refund, and the rest (configuration checks, namespaces) are opt-ins.
///
/// A wrapper, here one counting the checks asked of another store:
///
/// ```
/// use std::future::Future;
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tower_throttle::decision::Receipt;
/// use tower_throttle::store::{Answer, Charge, Decisions, Store, StoreError};
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// struct Counted<S> {
///     inner: S,
///     asked: AtomicU64,
/// }
///
/// impl<S: Store> Store for Counted<S> {
///     fn decide<'a>(
///         &'a self,
///         charges: &'a [Charge<'a>],
///     ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
///         self.asked.fetch_add(1, Ordering::Relaxed);
///         self.inner.decide(charges) // at once or later, as the inner store answers
///     }
///
///     fn refund(
///         &self,
///         key: &[u8],
///         policy: &Policy,
///         receipt: &Receipt,
///     ) -> impl Future<Output = Result<(), StoreError>> + Send {
///         self.inner.refund(key, policy, receipt)
///     }
///
///     fn reset(&self, key: &[u8], policy: &Policy) -> impl Future<Output = Result<(), StoreError>> + Send {
///         self.inner.reset(key, policy)
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = Counted { inner: MemoryStore::new(), asked: AtomicU64::new(0) };
/// let policy = Policy::fixed_window(1, std::time::Duration::from_secs(60))?;
/// // The memory store answers at once.
/// let answer = store.decide(&[Charge::new(b"k", &policy, 1)]).ready();
/// assert!(answer.expect("at once")?[0].allowed);
/// let replies = Limiter::new(store, policy);
/// assert!(!replies.check("k").await?.allowed);
/// assert_eq!(replies.store().asked.load(Ordering::Relaxed), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
/// ```
pub trait Store: Send + Sync + 'static {
    /// Decides several charges at once, all or nothing: the costs are
    /// consumed only if every one is allowed. When one denies, nothing
    /// changes: denying charges report their denial, and those that would
    /// have passed report a peek (`allowed: true`, `remaining` and
    /// `reset_after` of the unchanged state). Keys must be distinct. One
    /// decision per charge, in order.
    ///
    /// The answer is [`Answer::Now`] when the store decided in process
    /// (the memory store always does) and [`Answer::Later`] when it must
    /// wait (a network round trip): a future that does nothing until polled,
    /// so that a caller may drop it unpolled and charge nothing.
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a>;

    /// [`Store::decide`] awaited: every charge's decision. Not meant to be
    /// overridden: a wrapper forwards `decide` alone.
    fn check_all(
        &self,
        charges: &[Charge<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        async move {
            match self.decide(charges) {
                Answer::Now(result) => result.map(Decisions::into_vec),
                Answer::Later(later) => later.await.map(Decisions::into_vec),
            }
        }
    }

    /// [`Store::decide`] of one charge, awaited; consumes its cost only if
    /// allowed. A wrapper never overrides it; a store whose one charge has
    /// a path with no [`Decisions`] to unwrap may (the memory store's spares
    /// two copies of a 112-byte decision), answering as `decide` does.
    fn check(
        &self,
        charge: Charge<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        async move {
            let charges = [charge];
            // Matched, not awaited whole: an answer given at once is read
            // where it lies.
            let answer = self.decide(&charges);
            match answer {
                Answer::Now(result) => result?.into_one(),
                Answer::Later(later) => later.await?.into_one(),
            }
        }
    }

    /// Gives a charge's units back to `key` (for work that turned out not
    /// to count, a waiter that left): into the slot its [`Receipt`] names
    /// (the receipt of an admitted [`Decision`]), and nowhere else. A
    /// receipt whose slot has passed (its window ended, its GCRA debt was
    /// paid off, its permit was released) changes nothing. Give back part
    /// of a charge with [`Receipt::part`].
    fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets `key`: its next check sees a fresh state.
    fn reset(
        &self,
        key: &[u8],
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Releases a concurrency permit before its lease runs out. The
    /// default refunds every unit the permit holds ([`Store::refund`] of a
    /// receipt naming only the permit), which ends its lease.
    fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let whole_lease = Receipt::new(u64::MAX, 0, Some(permit));
        async move { self.refund(key, policy, &whole_lease).await }
    }

    /// Whether this store can run `rules`, checked together in one
    /// all-or-nothing call, before any traffic: [`ThrottleLayer`] calls it
    /// when it builds its service (and panics with the rule, the policy and
    /// this error) and [`Limiter::try_new`] returns its error. A store
    /// refuses here what it would otherwise refuse on every request, such as
    /// a policy it cannot evaluate exactly. The default accepts everything.
    ///
    /// [`ThrottleLayer`]: crate::ThrottleLayer
    /// [`Limiter::try_new`]: crate::Limiter::try_new
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        let _ = rules;
        Ok(())
    }

    /// Whether this store decides a GCRA policy with a widened tolerance as
    /// such: delay mode and [`Limiter::wait`] reserve a future slot by
    /// checking with one (see `Policy::reserving`). A store that runs only
    /// the policies as their users built them (redis-cell's `CL.THROTTLE`,
    /// governor) answers `false`, and its waiters check again after each
    /// denial's wait instead. The default is `true`.
    ///
    /// [`Limiter::wait`]: crate::Limiter::wait
    fn reserves_slots(&self) -> bool {
        true
    }

    /// The registry that refuses two layers sharing this store's counters
    /// by accident (see [`Namespaces`]); clones of a store must return the
    /// same one. `None` (the default): no check.
    fn namespaces(&self) -> Option<&Namespaces> {
        None
    }
}

/// True when the verdict of an all-or-nothing check admits the request.
pub(crate) fn all_allowed(decisions: &[Decision]) -> bool {
    decisions.iter().all(|d| d.allowed)
}

impl<S: Store> Store for std::sync::Arc<S> {
    fn namespaces(&self) -> Option<&Namespaces> {
        (**self).namespaces()
    }

    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        (**self).decide(charges)
    }

    // An `Arc` is the store itself, its own `check` included.
    fn check(
        &self,
        charge: Charge<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(charge)
    }

    fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).refund(key, policy, receipt)
    }

    fn reset(
        &self,
        key: &[u8],
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(key, policy)
    }

    fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, policy, permit)
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        (**self).validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        (**self).reserves_slots()
    }
}
