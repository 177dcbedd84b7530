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
//! # Starting without the primary
//!
//! A primary that connects in the background lets the app start while it
//! is down: `RedisStoreBuilder::connect_lazy` (feature `redis`) returns a
//! store that fails every call as unavailable until it has connected, so
//! the fallback decides until then, and the primary from its next probe on
//! (within the probe interval of connecting).
//!
//! # Within a caller's budget
//!
//! Under a layer's [`store_timeout`](crate::ThrottleLayer::store_timeout),
//! the primary gets three quarters of what is left of that budget, whatever
//! its own timeout: a primary that stalls (a frozen Redis) fails with
//! [`StoreError::Timeout`] then, and the fallback answers within the last
//! quarter, before the layer gives up. So a layer timeout shorter than the
//! primary's own (50 ms over a Redis timeout of 200 ms) gets the fallback's
//! decisions during a stall, never the layer's fail mode, and the failure
//! starts the probe interval as any other. A fallback that does I/O of its
//! own must answer within that last quarter. Without a caller's budget (a
//! [`Limiter`](crate::Limiter)), the primary's own timeout bounds it.
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
//! # Lock-outs
//!
//! The strikes and locks of a [`Penalty`](crate::lockout::Penalty)
//! ([`Charge::penalty`]) are kept in both stores: each one admitted on the
//! primary is made on the fallback too, and a check of a lock reads both and
//! answers the stricter. So a lock announced while the primary answered
//! holds while the fallback decides, and one announced during an outage
//! holds after the primary is back, each for its whole duration.
//!
//! # Permits, refunds and resets
//!
//! A concurrency permit is released on the store that granted it (the ids
//! of fallback permits are remembered until released or leased out). A
//! [`Store::refund`] goes to the store that took the charge (its
//! [`Receipt`] says which), whichever decides now: units
//! taken on the fallback during an outage are not given to the primary's
//! count after it, nor the other way round. A [`Store::reset`] goes to
//! both and reports the primary's error, if any; while the primary is
//! unavailable it goes to the fallback alone (the primary's state of the
//! key then lapses with its expiry).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::probe::{nanos, Probe, ProbeGate, ProbeGuard};
use super::{budget, Charge, MemoryStore, Namespaces, RuleSpec, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
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
    probe_interval: Duration,
    /// Open while the fallback decides: opened for the probe interval by each
    /// failure of the primary, closed by its first answer, one probe of the
    /// primary at a time once the interval has passed.
    gate: ProbeGate,
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
                probe_interval: DEFAULT_PROBE_INTERVAL,
                gate: ProbeGate::new(),
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
        self.shared_mut().probe_interval = interval;
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
        self.shared.gate.is_open()
    }
}

/// Where a call goes.
enum Route<'a> {
    /// To the primary; as the probe, with its turn, which the call holds to
    /// its end (dropped included).
    Primary(Option<ProbeGuard<'a>>),
    Fallback,
}

impl FallbackShared {
    fn route(&self) -> Route<'_> {
        match self.gate.try_probe(&*self.clock) {
            Probe::Closed => Route::Primary(None),
            Probe::Wait => Route::Fallback,
            Probe::Mine(turn) => Route::Primary(Some(turn)),
        }
    }

    fn primary_failed(&self, e: &StoreError) {
        if self.gate.open_for(&*self.clock, self.probe_interval) {
            tracing::warn!(target: "tower_throttle", error = %e,
                "rate-limit store unavailable: the fallback store decides until it answers again");
        }
    }

    fn primary_answered(&self) {
        if self.gate.close() {
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

    /// The fallback's own id of our permit `id`, left registered.
    fn their_permit(&self, id: PermitId) -> Option<PermitId> {
        let p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        p.map.get(&id).map(|&(theirs, _)| theirs)
    }

    fn take_permit(&self, id: PermitId) -> Option<PermitId> {
        let mut p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        p.map.remove(&id).map(|(theirs, _)| theirs)
    }
}

/// The primary's part of what is left of the caller's budget, in quarters:
/// the last quarter is the fallback's.
const PRIMARY_QUARTERS: u32 = 3;

/// Runs a primary call within [`PRIMARY_QUARTERS`] of what is left of the
/// caller's budget (a layer's `store_timeout`), if it set one: past that the
/// call fails with [`StoreError::Timeout`] and the fallback answers, before
/// the caller gives up on the whole call.
async fn within_share<T>(
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let Some(end) = budget::deadline() else {
        return call.await;
    };
    let now = tokio::time::Instant::now();
    let share = end.saturating_duration_since(now) * PRIMARY_QUARTERS / 4;
    budget::until(now + share, share, call).await
}

fn count_fallback() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_throttle_fallback_total").increment(1);
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

    /// Lock-out state lives in both stores, so that a lock announced by
    /// either holds whichever decides later: an admitted charge of it on
    /// the primary is made on the fallback too, and a peek of it reads both
    /// and answers the stricter.
    async fn with_penalty_mirror(&self, rule: Charge<'_>, d: Decision) -> Decision {
        if !rule.penalty || (rule.cost > 0 && !d.allowed) {
            return d;
        }
        // In-process fallbacks answer without a future.
        let mirrored = match self.fallback.check_now(rule) {
            Some(answer) => answer,
            None => self.fallback.check(rule).await,
        };
        self.stricter(rule, d, mirrored)
    }

    /// The peek of `rule` that reports less room: `primary`'s, or the
    /// fallback's `mirrored` one. A charge keeps the primary's answer.
    fn stricter(
        &self,
        rule: Charge<'_>,
        primary: Decision,
        mirrored: Result<Decision, StoreError>,
    ) -> Decision {
        match mirrored {
            Ok(f)
                if rule.cost == 0
                    && (f.remaining, std::cmp::Reverse(f.reset_after))
                        < (primary.remaining, std::cmp::Reverse(primary.reset_after)) =>
            {
                self.shared.adopt(rule.policy, f)
            }
            Ok(_) => primary,
            Err(error) => {
                tracing::warn!(target: "tower_throttle", %error,
                    "could not keep lock-out state in the fallback store too");
                primary
            }
        }
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
        match within_share(self.primary.check(rule)).await {
            Ok(d) => {
                self.shared.primary_answered();
                Ok(self.with_penalty_mirror(rule, d).await)
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
        match within_share(self.primary.check_all(rules)).await {
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

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        match receipt.store() {
            DecidedBy::Fallback => {
                let theirs = receipt.permit().and_then(|id| self.shared.their_permit(id));
                let r = receipt.with_permit(theirs).decided_by(DecidedBy::Primary);
                self.fallback.refund(key, policy, &r).await
            }
            DecidedBy::Primary => self.primary.refund(key, policy, receipt).await,
        }
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        let fallback = self.fallback.reset(key, policy).await;
        if self.is_on_fallback() {
            return fallback;
        }
        match self.primary.reset(key, policy).await {
            // An outage is no error here either (a lock-out resets strikes).
            Err(e) if e.is_unavailable() => {
                self.shared.primary_failed(&e);
                fallback
            }
            primary => primary.and(fallback),
        }
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
                Ok(d) if rule.penalty && (rule.cost == 0 || d.allowed) => {
                    // Mirrored when the fallback answers in process (the
                    // primary has charged already: no second try later).
                    Some(Ok(match self.fallback.check_now(rule) {
                        Some(mirrored) => self.stricter(rule, d, mirrored),
                        None => d,
                    }))
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
