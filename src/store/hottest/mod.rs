//! The hottest keys of any store, observed where decisions are made:
//! [`Hottest`] wraps a store (Redis, a [`FallbackStore`], a
//! [`LeasingStore`], the memory store) and counts each decided check by key,
//! so a layer or limiter on Redis reports its hottest keys like one on the
//! memory store, and a fallback period is counted like any other.
//!
//! Each count is a Space-Saving summary (Metwally, Agrawal and El Abbadi,
//! 2005): at most `capacity` keys are held; a key not held takes the place
//! of the least counted one and inherits its count as its possible error.
//! So a count is never below the key's true count and at most
//! [`KeyActivity::error`] above it ([`KeyActivity::lower_bound`] is the
//! least it can be), and every key with more than `total / capacity` of the
//! counted events is held. The report's `Display` prints each count exact
//! or with its bounds.
//!
//! The memory store keeps the same summaries itself
//! ([`MemoryStoreBuilder::track_hottest_keys`](crate::store::MemoryStoreBuilder::track_hottest_keys)),
//! sampled so that its in-process checks stay off the summary's lock; the
//! wrapper counts every check unless told to sample
//! ([`Hottest::sample_every`]): against a network round trip the lock is
//! nothing.
//!
//! [`FallbackStore`]: crate::store::FallbackStore
//! [`LeasingStore`]: crate::store::lease::LeasingStore

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;

mod report;
mod summary;

pub use report::{HottestKeys, KeyActivity};
pub(crate) use summary::{Tracker, Tracking};

/// A store that counts its hottest keys: every check decided through it,
/// by key, checks and denials (peeks, cost 0, and lock-out state are not
/// counted), over a recent interval, in bounded memory. Clones share the
/// counts.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::key::HeaderKey;
/// use tower_throttle::store::hottest::Hottest;
/// use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
///
/// // Any store: a `RedisStore`, a `FallbackStore`, a `LeasingStore`…
/// let store = Hottest::new(MemoryStore::new(), 64, Duration::from_secs(60));
/// let layer = ThrottleLayer::new(store, Policy::fixed_window(5, Duration::from_secs(60))?)
///     .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
///     .prefix("api");
/// // …serve, then from an admin endpoint:
/// let report = layer.store().hottest_keys(10);
/// println!("{report}");
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
pub struct Hottest<S, C: Clock = SystemClock> {
    inner: S,
    /// Shared by clones; the clock's clones read the same time.
    tracker: Arc<Tracker>,
    clock: C,
}

impl<S: Clone, C: Clock + Clone> Clone for Hottest<S, C> {
    fn clone(&self) -> Self {
        Hottest {
            inner: self.inner.clone(),
            tracker: self.tracker.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<S, C: Clock> std::fmt::Debug for Hottest<S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tracking = self.tracker.tracking();
        f.debug_struct("Hottest")
            .field("capacity", &tracking.capacity)
            .field("interval", &Duration::from_nanos(tracking.interval_ns))
            .field("sample_every", &tracking.sample_every)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Hottest<S> {
    /// Counts the checks of `store`: the `capacity` most counted keys by
    /// checks and by denials (1 to 65,536; memory is four summaries of
    /// `capacity` keys), over intervals of `interval` (at least 1 ms), every
    /// check counted, on the system clock.
    pub fn new(store: S, capacity: usize, interval: Duration) -> Self {
        let tracking = Tracking::new(capacity, interval, 1);
        Hottest::with_tracking(store, tracking, SystemClock::new())
    }
}

impl<S: Store, C: Clock> Hottest<S, C> {
    fn with_tracking(inner: S, tracking: Tracking, clock: C) -> Self {
        Hottest {
            inner,
            tracker: Arc::new(Tracker::new(tracking, clock.now_ns())),
            clock,
        }
    }

    /// The same tracking on `clock` (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests), counting
    /// afresh: call it before any check.
    pub fn clock<C2: Clock>(self, clock: C2) -> Hottest<S, C2> {
        Hottest::with_tracking(self.inner, self.tracker.tracking(), clock)
    }

    /// Counts one check in `every` (per thread, at least 1; default 1),
    /// each `every` times, counting afresh: call it before any check. Worth
    /// it only for a store deciding in process at a high rate; the report
    /// then holds estimates ([`KeyActivity::estimated`]).
    #[must_use]
    pub fn sample_every(self, every: u32) -> Self {
        let tracking = Tracking {
            sample_every: every.max(1),
            ..self.tracker.tracking()
        };
        Hottest::with_tracking(self.inner, tracking, self.clock)
    }

    /// The `n` keys with the most checks and the `n` with the most
    /// denials, most first, over the last whole interval and the one under
    /// way.
    pub fn hottest_keys(&self, n: usize) -> HottestKeys {
        self.tracker.report(n, self.clock.now_ns())
    }

    /// The store whose checks are counted.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Counts the decided `rule`, unless it is a peek or lock-out state.
    #[inline]
    fn note(&self, rule: &Charge<'_>, denied: bool) {
        if rule.cost > 0 && !rule.penalty {
            self.tracker
                .note_at(rule.key, denied, || self.clock.now_ns());
        }
    }

    fn note_all(&self, rules: &[Charge<'_>], decisions: &[Decision]) {
        for (rule, d) in rules.iter().zip(decisions) {
            self.note(rule, !d.allowed);
        }
    }
}

impl<S: Store, C: Clock> Store for Hottest<S, C> {
    // The answers pass through as they are, tested in place: rebuilding
    // them would copy a whole decision on every check.
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        match self.inner.decide(charges) {
            Answer::Now(answer) => {
                if let Ok(decisions) = &answer {
                    self.note_all(charges, decisions);
                }
                Answer::Now(answer)
            }
            // Asked again where it is awaited (the first answer, dropped
            // unpolled, charged nothing): a future held and awaited in an
            // async block would be laid out twice in it.
            Answer::Later(_) => Answer::later(async move {
                let decisions = self.inner.decide(charges).await?;
                self.note_all(charges, &decisions);
                Ok(decisions)
            }),
        }
    }

    fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(key, policy, receipt)
    }

    fn reset(
        &self,
        key: &[u8],
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(key, policy)
    }

    fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(key, policy, permit)
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.inner.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.inner.reserves_slots()
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        // Layers on the wrapper and on the store itself share one registry.
        self.inner.namespaces()
    }
}

#[cfg(test)]
mod tests;
