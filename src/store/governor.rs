//! A [`Store`] on [governor]'s keyed GCRA limiter, for teams that already run governor.
//!
//! Governor's GCRA is the same machine as [`Policy::cell`]: for the same
//! policy, clock and requests, `allowed` and `retry_after` are identical (the
//! tests check this). Documented differences, all from governor's API:
//!
//! - GCRA policies only; window, log and concurrency policies are
//!   [`StoreError::Unsupported`].
//! - No peek (cost 0), refund, reset or release, and no all-or-nothing check
//!   over several rules: each is [`StoreError::Unsupported`].
//! - `reset_after` of an admitted check is an upper bound rounded to whole
//!   emission intervals (governor exposes the remaining capacity, not the
//!   theoretical arrival time); denials report it exactly.
//! - A cost that can never be admitted reports `remaining` 0 and no
//!   `reset_after` (governor refuses it without reading the key's state); so
//!   is any cost above `u32::MAX`.
//! - Each check copies the key (governor's keyed API takes an owned key type).
//!
//! [governor]: https://docs.rs/governor

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use governor::clock::{Clock as GovClock, DefaultClock, Reference};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use std::future::Future;

use super::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};
use crate::algorithm::gcra;
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, GcraParams, Policy};

type Keyed<C> =
    RateLimiter<Box<[u8]>, DefaultKeyedStateStore<Box<[u8]>>, C, StateInformationMiddleware>;

/// GCRA on governor's keyed rate limiter (DashMap state). Clones share state.
pub struct GovernorStore<C: GovClock = DefaultClock> {
    clock: C,
    limiters: Arc<RwLock<HashMap<Policy, Arc<Keyed<C>>>>>,
    /// Refuses two layers sharing counters by accident (shared by clones).
    namespaces: Namespaces,
}

impl<C: GovClock + Clone> Clone for GovernorStore<C> {
    fn clone(&self) -> Self {
        GovernorStore {
            clock: self.clock.clone(),
            limiters: self.limiters.clone(),
            namespaces: self.namespaces.clone(),
        }
    }
}

impl<C: GovClock> std::fmt::Debug for GovernorStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GovernorStore").finish_non_exhaustive()
    }
}

impl GovernorStore<DefaultClock> {
    /// A store on governor's default clock.
    pub fn new() -> Self {
        Self::with_clock(DefaultClock::default())
    }
}

impl Default for GovernorStore<DefaultClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> GovernorStore<C>
where
    C: GovClock + Clone + Send + Sync + 'static,
{
    /// A store on a governor clock (e.g. `FakeRelativeClock` in tests).
    pub fn with_clock(clock: C) -> Self {
        GovernorStore {
            clock,
            limiters: Arc::default(),
            namespaces: Namespaces::default(),
        }
    }

    fn limiter(&self, policy: &Policy, p: &GcraParams) -> Result<Arc<Keyed<C>>, StoreError> {
        if let Some(l) = self
            .limiters
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(policy)
        {
            return Ok(l.clone());
        }
        let burst = u32::try_from(p.limit)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or(StoreError::Unsupported("a GCRA limit above u32::MAX"))?;
        let quota = Quota::with_period(Duration::from_nanos(p.emission_interval_ns))
            .ok_or(StoreError::Unsupported("a zero emission interval"))?
            .allow_burst(burst);
        let mut map = self
            .limiters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let limiter = map.entry(*policy).or_insert_with(|| {
            Arc::new(
                RateLimiter::dashmap_with_clock(quota, self.clock.clone())
                    .with_middleware::<StateInformationMiddleware>(),
            )
        });
        Ok(limiter.clone())
    }

    /// Decides one rule now.
    pub fn check_sync(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        let Algorithm::Gcra(p) = rule.policy.algorithm() else {
            return Err(StoreError::Unsupported("non-GCRA policies on governor"));
        };
        let never = Decision {
            charged: 0,
            charged_at_ns: 0,
            decided_by: Default::default(),
            allowed: false,
            limit: p.limit,
            remaining: 0,
            retry_after: None,
            reset_after: Duration::ZERO,
            quota_after: Duration::ZERO,
            permit: None,
        };
        let Some(n) = u32::try_from(rule.cost).ok() else {
            return Ok(never);
        };
        let n = NonZeroU32::new(n).ok_or(StoreError::Unsupported("peek (cost 0) on governor"))?;
        let limiter = self.limiter(rule.policy, p)?;
        let key: Box<[u8]> = rule.key.into();
        let t = Duration::from_nanos(p.emission_interval_ns);
        let tau = Duration::from_nanos(p.tolerance_ns);
        match limiter.check_key_n(&key, n) {
            Err(_insufficient) => Ok(never),
            Ok(Ok(snapshot)) => {
                let remaining = u64::from(snapshot.remaining_burst_capacity());
                let reset_after = tau.saturating_sub(t * u32::try_from(remaining).unwrap_or(0));
                Ok(Decision {
                    charged: 0,
                    charged_at_ns: 0,
                    decided_by: Default::default(),
                    allowed: true,
                    limit: p.limit,
                    remaining,
                    retry_after: None,
                    reset_after,
                    quota_after: gcra::quota_after(p, nanos(reset_after), remaining),
                    permit: None,
                })
            }
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(self.clock.now());
                let inc = t.saturating_mul(n.get());
                // Denied: tat − now = wait + τ − inc, exactly.
                let ttl = (wait + tau).saturating_sub(inc);
                // The algorithm's own count of what is left (a cell policy's
                // is redis-cell's, to the bit), as every store reports it.
                let remaining = gcra::remaining(p, nanos(ttl));
                Ok(Decision {
                    charged: 0,
                    charged_at_ns: 0,
                    decided_by: Default::default(),
                    allowed: false,
                    limit: p.limit,
                    remaining,
                    retry_after: Some(wait),
                    reset_after: ttl,
                    quota_after: gcra::quota_after(p, nanos(ttl), remaining).min(wait),
                    permit: None,
                })
            }
        }
    }
}

impl<C> Store for GovernorStore<C>
where
    C: GovClock + Clone + Send + Sync + 'static,
    C::Instant: Reference + Send + Sync,
{
    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.namespaces)
    }

    /// governor's quotas are fixed when built: a widened tolerance is not
    /// applied, so delay mode checks again instead of reserving.
    fn reserves_slots(&self) -> bool {
        false
    }

    /// Refuses non-GCRA policies, GCRA limits above `u32::MAX` and more than
    /// one rule per check.
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        if rules.len() > 1 {
            return Err(StoreError::Unsupported("all-or-nothing rules on governor"));
        }
        for rule in rules {
            let Algorithm::Gcra(p) = rule.policy.algorithm() else {
                return Err(StoreError::Unsupported("non-GCRA policies on governor"));
            };
            if u32::try_from(p.limit).is_err() {
                return Err(StoreError::Unsupported("a GCRA limit above u32::MAX"));
            }
        }
        Ok(())
    }

    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        Answer::<std::future::Pending<_>>::Now(match charges {
            [charge] => self.check_sync(*charge).map(Decisions::one),
            _ => Err(StoreError::Unsupported("all-or-nothing rules on governor")),
        })
    }

    async fn refund(
        &self,
        _: &[u8],
        _: &Policy,
        _: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unsupported("refund on governor"))
    }

    async fn reset(&self, _: &[u8], _: &Policy) -> Result<(), StoreError> {
        Err(StoreError::Unsupported("reset on governor"))
    }

    async fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Result<(), StoreError> {
        Err(StoreError::Unsupported("concurrency permits on governor"))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
