//! Lock-outs: after repeated denials, refuse a key for a while.
//!
//! A [`Penalty`] counts the denials of a key (its *strikes*) and, when a key
//! collects `strikes` denials within `within`, locks it for `lock`: every
//! check of the key is then refused, without being charged, with
//! `retry_after` = the time left on the lock (the `Retry-After` of a 429).
//! When the lock ends the key starts over with no strikes and whatever quota
//! its rule holds by then. The classic use is a login form: 5 refused
//! attempts within 15 minutes lock the account (or the client) for an hour.
//!
//! It is built on plain store calls, so it works the same on every
//! [`Store`] (memory, Redis, Redis Cluster, a
//! [`FallbackStore`](crate::store::FallbackStore)), and the lock is shared
//! by every instance sharing the store:
//!
//! * the strikes are a sliding log of `strikes` per `within` on the key
//!   `<penalty prefix>:strikes:<key>`, charged once per denial;
//! * the lock is a GCRA key `<penalty prefix>:lock:<key>` of one unit per
//!   `lock`: charging it sets its state to *now + lock*, and a peek (cost 0)
//!   reads how much of the lock is left.
//!
//! A check of a key that is not locked costs one peek more than the check
//! itself (in process: a hash lookup of a key that usually does not exist;
//! on Redis: one more round trip, batched with the others); a denial costs
//! one charge of the strikes key, and the denial that locks two more calls.
//!
//! [`Limiter::lockout`](crate::Limiter::lockout) is the direct API, and
//! [`ThrottleLayer::lockout`](crate::ThrottleLayer::lockout) applies a
//! penalty to every rule key of a layer. Both take one sequence, built from
//! this module's steps: the locks of the keys (a limiter's caller key, or
//! every rule key of a layer's request) are read once; a locked key is
//! refused without a check; otherwise the check runs (and, waiting,
//! retries); each key its final denial names counts a strike (a peek never
//! does, nor a layer's key every client shares), and a strike that locks
//! answers with the lock's denial. Any other caller uses
//! the hooks [`Penalty::check_locked`] (before the check) and
//! [`Penalty::record_denial`] (after a denial) the same way.

use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use crate::store::{Charge, Reach, RuleSpec, Store, StoreError};

/// Locks a key out for `lock` after `strikes` denials within `within`.
/// See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Penalty {
    strikes: Policy,
    lock: Policy,
    lock_for: Duration,
    prefix: Box<[u8]>,
}

impl Penalty {
    /// Locks a key for `lock` once it is denied `strikes` times within
    /// `within`. Errors when a count or a duration is zero.
    pub fn new(strikes: u64, within: Duration, lock: Duration) -> Result<Self, PolicyError> {
        Ok(Penalty {
            strikes: Policy::sliding_log(strikes, within)?,
            // One unit per `lock`, no burst: charging it once makes the key
            // refuse everything for exactly `lock`.
            lock: Policy::cell(0, 1, lock)?,
            lock_for: lock,
            prefix: b"penalty:".to_vec().into_boxed_slice(),
        })
    }

    /// Puts the penalty's keys under `prefix:` (default `penalty`), so that
    /// two penalties on one store keep apart. Give it a prefix no limiter of
    /// the store uses.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        let mut p = prefix.as_ref().to_vec();
        p.push(b':');
        self.prefix = p.into_boxed_slice();
        self
    }

    /// How long a key stays locked.
    pub fn lock_duration(&self) -> Duration {
        self.lock_for
    }

    /// The policy counting strikes (a sliding log of `strikes` per `within`).
    pub fn strikes_policy(&self) -> &Policy {
        &self.strikes
    }

    /// Whether `store` can keep this penalty's strikes (a sliding log) and
    /// locks (a one-unit GCRA): [`ThrottleLayer`](crate::ThrottleLayer)
    /// asks when it builds a layer with a lock-out, so a store that cannot
    /// (`CellStore`, `GovernorStore`) is refused before traffic. Returns the
    /// refused policy with the store's reason.
    pub fn validate<S: Store>(&self, store: &S) -> Result<(), (Policy, StoreError)> {
        for (kind, policy) in [(&b"strikes:"[..], &self.strikes), (b"lock:", &self.lock)] {
            let head = self.derived(kind, b"");
            store
                .validate(&[RuleSpec::new(policy, &head)])
                .map_err(|error| (*policy, error))?;
        }
        Ok(())
    }

    fn derived(&self, kind: &[u8], key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], kind, key].concat()
    }

    /// The time left on `key`'s lock, `None` when it is not locked. Changes
    /// nothing: call it before checking the key's rule, and refuse the
    /// request (with [`Penalty::locked`]) while it is `Some`.
    pub async fn check_locked<S: Store>(
        &self,
        store: &S,
        key: &[u8],
    ) -> Result<Option<Duration>, StoreError> {
        let locks = self.locks(store, [key], Reach::Later).await?;
        Ok(locks.into_iter().flatten().next().map(|(_, left)| left))
    }

    /// The first step of the sequence: the locks of `keys`, as each locked
    /// key's position and the time left on its lock. Through `reach`:
    /// `None` when [`Reach::Now`] meets a store that answers later (nothing
    /// was read, and peeks charge nothing).
    pub(crate) async fn locks<'k, S: Store>(
        &self,
        store: &S,
        keys: impl IntoIterator<Item = &'k [u8]>,
        reach: Reach,
    ) -> Result<Option<Vec<(usize, Duration)>>, StoreError> {
        let mut locked = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            let lock_key = self.lock_key(key);
            let peek = Charge::new(&lock_key, &self.lock, 0).of_penalty();
            let Some(answer) = reach.answer(store.decide(&[peek])).await else {
                return Ok(None);
            };
            if let Some(left) = lock_left(&answer?.into_one()?) {
                locked.push((i, left));
            }
        }
        Ok(Some(locked))
    }

    /// The store key of `key`'s lock.
    fn lock_key(&self, key: &[u8]) -> Vec<u8> {
        self.derived(b"lock:", key)
    }

    /// Counts a denial of `key`. `Some(lock)` when it was the strike that
    /// locks the key (or the key was locked meanwhile): the time the key
    /// now stays locked, to answer this request with [`Penalty::locked`].
    pub async fn record_denial<S: Store>(
        &self,
        store: &S,
        key: &[u8],
    ) -> Result<Option<Duration>, StoreError> {
        let strikes_key = self.derived(b"strikes:", key);
        let strike = store
            .check(Charge::new(&strikes_key, &self.strikes, 1).of_penalty())
            .await?;
        // Admitted with units left: below the bound. Admitted with none left
        // is the `strikes`-th denial; denied means concurrent denials
        // already took the last strike: lock in both cases.
        if strike.allowed && strike.remaining > 0 {
            return Ok(None);
        }
        let lock_key = self.lock_key(key);
        let lock = store
            .check(Charge::new(&lock_key, &self.lock, 1).of_penalty())
            .await?;
        // After the lock the key starts over with no strikes.
        store.reset(&strikes_key, &self.strikes).await?;
        Ok(Some(if lock.allowed {
            self.lock_for
        } else {
            // Already locked by a concurrent denial: what is left of it.
            lock.retry_after.unwrap_or(self.lock_for)
        }))
    }

    /// The sequence's strike step: one strike ([`Penalty::record_denial`])
    /// for each of `keys` (its position and key), in order. Owns what it
    /// needs, so that it can finish in the background.
    pub(crate) async fn strike_each<S: Store>(
        self: Arc<Self>,
        store: Arc<S>,
        keys: Vec<(usize, Vec<u8>)>,
    ) -> Struck {
        let mut locks = Vec::with_capacity(keys.len());
        for (i, key) in keys {
            locks.push((i, self.record_denial(&*store, &key).await));
        }
        Struck {
            penalty: self,
            locks,
        }
    }

    /// Lifts `key`'s lock and forgets its strikes.
    pub async fn unlock<S: Store>(&self, store: &S, key: &[u8]) -> Result<(), StoreError> {
        let lock_key = self.lock_key(key);
        let strikes_key = self.derived(b"strikes:", key);
        store.reset(&lock_key, &self.lock).await?;
        store.reset(&strikes_key, &self.strikes).await
    }

    /// The denial answering a check of a key locked for `left` more, for a
    /// rule of `policy`: nothing remaining, `retry_after` = `left`.
    pub fn locked(&self, policy: &Policy, left: Duration) -> Decision {
        Decision {
            charged: 0,
            charged_at_ns: 0,
            allowed: false,
            limit: policy.limit(),
            remaining: 0,
            retry_after: Some(left),
            reset_after: left,
            quota_after: left,
            permit: None,
            decided_by: Default::default(),
        }
    }

    /// The last step of the sequence: [`Penalty::locked`] answering a check
    /// whose denial (`struck`, if any) locked its key; that denial stays
    /// named as the decider.
    pub(crate) fn lock_denial(
        &self,
        policy: &Policy,
        left: Duration,
        struck: Option<&Decision>,
    ) -> Decision {
        Decision {
            decided_by: struck.map(|d| d.decided_by).unwrap_or_default(),
            ..self.locked(policy, left)
        }
    }
}

/// What [`Penalty::strike_each`] recorded: per struck key, its position and
/// the lock its strike set (`None`: not locked yet), or the store's error.
pub(crate) struct Struck {
    pub(crate) penalty: Arc<Penalty>,
    pub(crate) locks: Vec<(usize, Result<Option<Duration>, StoreError>)>,
}

/// The time left on a lock from a peek of its key: GCRA of one unit and no
/// burst has nothing remaining exactly while locked, and returns to a fresh
/// state (`reset_after`) when the lock ends.
fn lock_left(peek: &Decision) -> Option<Duration> {
    (peek.remaining == 0 && !peek.reset_after.is_zero()).then_some(peek.reset_after)
}

#[cfg(test)]
mod tests;
