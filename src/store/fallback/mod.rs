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
//! (`tests/redis_outages/redis_outages.rs` puts a real Redis in each of these states:
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
//!
//! [`StoreError::is_unavailable`]: crate::store::StoreError::is_unavailable
//! [`StoreError::Unavailable`]: crate::store::StoreError::Unavailable
//! [`StoreError::Timeout`]: crate::store::StoreError::Timeout
//! [`Decision::decided_by`]: crate::Decision::decided_by
//! [`DecidedBy::Fallback`]: crate::decision::DecidedBy::Fallback
//! [`Charge::penalty`]: crate::store::Charge::penalty
//! [`Receipt`]: crate::decision::Receipt

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::probe::ProbeGate;
use super::{MemoryStore, Store};
use crate::clock::{Clock, SystemClock};

// Which store decides (`route`), the ids of permits the fallback granted
// (`permits`), and the `Store` impl that puts both together (`store_impl`).
mod permits;
mod route;
mod store_impl;

use permits::FallbackPermits;

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
/// let d = replies.check("user-42").await?; // Redis, or memory while Redis is down
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

/// What clones share: the switch between the stores (see `route.rs`) and
/// the ids of the fallback's permits (see `permits.rs`).
struct FallbackShared {
    clock: Box<dyn Clock>,
    probe_interval: Duration,
    /// Open while the fallback decides: opened for the probe interval by each
    /// failure of the primary, closed by its first answer, one probe of the
    /// primary at a time once the interval has passed.
    gate: ProbeGate,
    permits: Mutex<FallbackPermits>,
}

impl<P: Store, F: Store> FallbackStore<P, F> {
    /// Asks `primary`, and `fallback` while `primary` is unavailable.
    pub fn new(primary: P, fallback: F) -> Self {
        FallbackStore {
            primary,
            fallback,
            shared: Arc::new(FallbackShared {
                clock: Box::new(SystemClock::new()),
                probe_interval: DEFAULT_PROBE_INTERVAL,
                gate: ProbeGate::new(),
                permits: Mutex::new(FallbackPermits::new()),
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

#[cfg(test)]
mod tests;
