//! Keep limiting when the shared store is down: [`FallbackStore`].
//!
//! A [`FallbackStore`] sends every call to its primary store (Redis, say)
//! and, when the primary is **unavailable** ([`StoreError::is_unavailable`]:
//! a timeout, a broken or refused connection, a cluster that cannot route,
//! or a server that answers but cannot decide now, [`StoreError::Unavailable`]:
//! out of memory under `noeviction`, busy with another client's script,
//! loading its data, a replica, a replica without its master, scripts a
//! reload does not bring back), answers from its fallback store instead (an
//! in-process [`MemoryStore`]), so requests are neither waved through nor
//! refused with a 503 while the primary cannot decide
//! (`tests/redis_outages.rs` puts a real Redis in each of these states:
//! every check is decided by the fallback, within its limit, and a
//! fail-closed layer answers no 503). Other errors (a malformed request, a
//! policy the store does not support, a misconfigured server, a reply the
//! store does not understand) are returned as they are: the fallback would
//! hide a bug.
//!
//! # Switching
//!
//! After a failure the fallback decides alone for the
//! [probe interval](FallbackStore::probe_interval) (1 s by default), so the
//! primary's timeout or connection attempt is not paid by every request
//! while it is down. Then one call at a time goes to the primary again (the
//! others stay on the fallback until it answers); its first answer switches
//! every call back. Each switch logs a `tracing` warning (target
//! `tower_throttle`), and each check decided by the fallback has
//! [`Decision::decided_by`] = [`DecidedBy::Fallback`] (also readable from
//! [`RateLimitInfo::decided_by`](crate::RateLimitInfo::decided_by)); with the
//! `metrics` feature the counter `tower_throttle_fallback_total` counts them.
//!
//! # What the fallback admits
//!
//! The fallback has its own state and applies the rules' own policies: a
//! key starts fresh on it when the primary goes down, and finds its primary
//! state where it was when the primary comes back (a Redis restarted
//! without persistence starts fresh too). So while the primary is down,
//! each app instance admits at most each limit on its own: with `N`
//! instances, a key gets at most `N ×` its limit during the outage, plus
//! what the primary had admitted before it in the same window. Never
//! unlimited, never a 503. A per-instance share (`limit / N` on the
//! fallback only) is not built in, since a rule carries one policy for both
//! stores; where `N ×` is too generous for a rule (a login guard), keep
//! that rule on the primary alone, with a fail mode
//! ([`FailMode::Closed`](crate::FailMode::Closed)) instead of a fallback.
//!
//! # Permits, refunds and resets
//!
//! A concurrency permit is released on the store that granted it (the ids
//! of fallback permits are remembered until released or leased out). A
//! [`Store::refund`] goes to the store deciding at the time of the refund; a
//! [`Store::reset`] goes to both, and reports the primary's error, if any.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::{Charge, MemoryStore, Namespaces, RuleSpec, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{DecidedBy, Decision, PermitId};
use crate::policy::Policy;

/// Default time the fallback decides alone after the primary failed.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// A store that answers from `fallback` while `primary` is unavailable.
/// See the [module docs](self).
///
/// ```no_run
/// # #[cfg(feature = "redis")]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_throttle::store::{FallbackStore, RedisStore};
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// let redis = RedisStore::builder()
///     .timeout(Duration::from_millis(50))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// let store = FallbackStore::new(redis, MemoryStore::new());
/// let replies = Limiter::new(store, Policy::sliding_log(5, Duration::from_secs(60))?);
/// let d = replies.check("laoqian").await?; // Redis, or memory while Redis is down
/// # let _ = d;
/// # Ok(())
/// # }
/// ```
///
/// Clones share both stores and the switch state.
pub struct FallbackStore<P, F = MemoryStore> {
    primary: P,
    fallback: F,
    shared: Arc<FallbackShared>,
}

impl<P: Clone, F: Clone> Clone for FallbackStore<P, F> {
    fn clone(&self) -> Self {
        FallbackStore {
            primary: self.primary.clone(),
            fallback: self.fallback.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<P, F> std::fmt::Debug for FallbackStore<P, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackStore")
            .field("on_fallback", &self.is_on_fallback())
            .finish_non_exhaustive()
    }
}

struct FallbackShared {
    clock: Box<dyn Clock>,
    probe_ns: u64,
    /// 0 while the primary answers; else the clock reading until which the
    /// fallback decides without asking the primary.
    open_until: AtomicU64,
    /// One probe of the primary at a time once `open_until` has passed.
    probing: AtomicBool,
    permits: Mutex<FallbackPermits>,
}

/// Ids handed out for permits the fallback granted: ours → the fallback's.
struct FallbackPermits {
    map: HashMap<PermitId, (PermitId, u64)>,
    base: u64,
    next: u64,
    prune_at: usize,
}

const MIN_PRUNE_AT: usize = 1024;

impl<P: Store, F: Store> FallbackStore<P, F> {
    /// Asks `primary`, and `fallback` while `primary` is unavailable.
    pub fn new(primary: P, fallback: F) -> Self {
        // A random base, as the Redis store's: our ids must not collide with
        // the primary's, which pass through unchanged.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        FallbackStore {
            primary,
            fallback,
            shared: Arc::new(FallbackShared {
                clock: Box::new(SystemClock::new()),
                probe_ns: nanos(DEFAULT_PROBE_INTERVAL),
                open_until: AtomicU64::new(0),
                probing: AtomicBool::new(false),
                permits: Mutex::new(FallbackPermits {
                    map: HashMap::new(),
                    base: h.finish(),
                    next: 0,
                    prune_at: MIN_PRUNE_AT,
                }),
            }),
        }
    }

    /// How long the fallback decides alone after the primary failed before
    /// the primary is tried again (default [`DEFAULT_PROBE_INTERVAL`]). Zero
    /// tries the primary on every call.
    #[must_use]
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.shared_mut().probe_ns = nanos(interval);
        self
    }

    /// The clock timing the probe interval (tests use a
    /// [`ManualClock`](crate::clock::ManualClock)).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.shared_mut().clock = Box::new(clock);
        self
    }

    fn shared_mut(&mut self) -> &mut FallbackShared {
        Arc::get_mut(&mut self.shared).expect("configure a FallbackStore before cloning it")
    }

    /// The primary store.
    pub fn primary(&self) -> &P {
        &self.primary
    }

    /// The fallback store.
    pub fn fallback(&self) -> &F {
        &self.fallback
    }
}

impl<P, F> FallbackStore<P, F> {
    /// True while the fallback decides (the primary failed and has not
    /// answered since).
    pub fn is_on_fallback(&self) -> bool {
        self.shared.open_until.load(Ordering::Acquire) != 0
    }
}

/// Where a call goes.
enum Route<'a> {
    Primary(Option<PrimaryProbeClaim<'a>>),
    Fallback,
}

/// The probe claim, given back however the probing call ends (dropped included).
struct PrimaryProbeClaim<'a>(&'a AtomicBool);

impl Drop for PrimaryProbeClaim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl FallbackShared {
    fn route(&self) -> Route<'_> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Route::Primary(None);
        }
        if self.clock.now_ns() < until {
            return Route::Fallback;
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Route::Primary(Some(PrimaryProbeClaim(&self.probing))),
            Err(_) => Route::Fallback,
        }
    }

    fn primary_failed(&self, e: &StoreError) {
        let until = self.clock.now_ns().saturating_add(self.probe_ns).max(1);
        if self.open_until.swap(until, Ordering::AcqRel) == 0 {
            tracing::warn!(target: "tower_throttle", error = %e,
                "rate-limit store unavailable: the fallback store decides until it answers again");
        }
    }

    fn primary_answered(&self) {
        if self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
        {
            tracing::warn!(target: "tower_throttle",
                "rate-limit store answers again: back from the fallback store");
        }
    }

    /// Marks `d` as the fallback's, and gives its permit an id of ours.
    fn adopt(&self, policy: &Policy, mut d: Decision) -> Decision {
        d.decided_by = DecidedBy::Fallback;
        if let Some(theirs) = d.permit {
            let now = self.clock.now_ns();
            let expires = now.saturating_add(nanos(policy.window()));
            let mut p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
            if p.map.len() >= p.prune_at {
                // Permits never released lapse with their lease: forget them.
                p.map.retain(|_, (_, exp)| *exp > now);
                p.prune_at = (p.map.len() * 2).max(MIN_PRUNE_AT);
            }
            let ours = PermitId(p.base.wrapping_add(p.next));
            p.next += 1;
            p.map.insert(ours, (theirs, expires));
            d.permit = Some(ours);
        }
        d
    }

    fn take_permit(&self, id: PermitId) -> Option<PermitId> {
        let mut p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        p.map.remove(&id).map(|(theirs, _)| theirs)
    }
}

fn count_fallback() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_throttle_fallback_total").increment(1);
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<P: Store, F: Store> FallbackStore<P, F> {
    async fn fallback_check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        count_fallback();
        let d = self.fallback.check(rule).await?;
        Ok(self.shared.adopt(rule.policy, d))
    }

    async fn fallback_check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        count_fallback();
        let ds = self.fallback.check_all(rules).await?;
        Ok(self.adopt_all(rules, ds))
    }

    fn adopt_all(&self, rules: &[Charge<'_>], ds: Vec<Decision>) -> Vec<Decision> {
        ds.into_iter()
            .zip(rules)
            .map(|(d, r)| self.shared.adopt(r.policy, d))
            .collect()
    }
}

impl<P: Store, F: Store> Store for FallbackStore<P, F> {
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        let Route::Primary(_claim) = self.shared.route() else {
            return self.fallback_check(rule).await;
        };
        match self.primary.check(rule).await {
            Ok(d) => {
                self.shared.primary_answered();
                Ok(d)
            }
            Err(e) if e.is_unavailable() => {
                self.shared.primary_failed(&e);
                self.fallback_check(rule).await
            }
            Err(e) => Err(e),
        }
    }

    async fn check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        let Route::Primary(_claim) = self.shared.route() else {
            return self.fallback_check_all(rules).await;
        };
        match self.primary.check_all(rules).await {
            Ok(d) => {
                self.shared.primary_answered();
                Ok(d)
            }
            Err(e) if e.is_unavailable() => {
                self.shared.primary_failed(&e);
                self.fallback_check_all(rules).await
            }
            Err(e) => Err(e),
        }
    }

    async fn refund(&self, key: &[u8], policy: &Policy, amount: u64) -> Result<(), StoreError> {
        if self.is_on_fallback() {
            return self.fallback.refund(key, policy, amount).await;
        }
        self.primary.refund(key, policy, amount).await
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        let fallback = self.fallback.reset(key, policy).await;
        self.primary.reset(key, policy).await.and(fallback)
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        match self.shared.take_permit(permit) {
            Some(theirs) => self.fallback.release(key, policy, theirs).await,
            None => self.primary.release(key, policy, permit).await,
        }
    }

    fn check_now(&self, rule: Charge<'_>) -> Option<Result<Decision, StoreError>> {
        match self.shared.route() {
            // While the primary is down an in-process fallback decides
            // without a future, as it would alone.
            Route::Fallback => {
                let d = self.fallback.check_now(rule)?;
                count_fallback();
                Some(d.map(|d| self.shared.adopt(rule.policy, d)))
            }
            // A probe needs the asynchronous path (and its claim).
            Route::Primary(Some(_)) => None,
            Route::Primary(None) => match self.primary.check_now(rule)? {
                Err(e) if e.is_unavailable() => {
                    self.shared.primary_failed(&e);
                    None
                }
                other => Some(other),
            },
        }
    }

    fn check_all_now(&self, rules: &[Charge<'_>]) -> Option<Result<Vec<Decision>, StoreError>> {
        match self.shared.route() {
            Route::Fallback => {
                let ds = self.fallback.check_all_now(rules)?;
                count_fallback();
                Some(ds.map(|ds| self.adopt_all(rules, ds)))
            }
            Route::Primary(Some(_)) => None,
            Route::Primary(None) => match self.primary.check_all_now(rules)? {
                Err(e) if e.is_unavailable() => {
                    self.shared.primary_failed(&e);
                    None
                }
                other => Some(other),
            },
        }
    }

    /// Both stores must run the rules: either may decide them.
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.primary.validate(rules)?;
        self.fallback.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.primary.reserves_slots() && self.fallback.reserves_slots()
    }

    fn namespaces(&self) -> Option<&Namespaces> {
        self.primary.namespaces()
    }
}

#[cfg(test)]
mod tests;
