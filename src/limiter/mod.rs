//! The direct API: rate limiting without HTTP.
//!
//! One type, [`Limiter`], grows by composition:
//!
//! * `Limiter::new(store, policy)` applies one policy by key: the classic
//!   `is_action_allowed`. Its checks answer a [`Decision`].
//! * [`.and(name, policy)`](Limiter::and) adds a rule that must admit every
//!   check too, all or nothing in one store call ("5 a minute AND 100 a
//!   day"). Its checks answer [`RuleDecisions`], one per rule.
//! * [`.lockout(penalty)`](Limiter::lockout) refuses a key for a while after
//!   repeated denials (see [`crate::lockout`]), with one rule or several.
//!
//! Keys are `prefix:key` for a rule without a name and `prefix:name:key` for
//! a named one (no `prefix:` unless [`Limiter::with_prefix`] set one); a
//! penalty's keys derive from `prefix:key`, one lock per caller whatever the
//! rules. Clones share the store.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::lockout::Penalty;
use crate::policy::Policy;
use crate::policy::{effective_policy, rebase};
use crate::store::{all_allowed, Charge, MemoryStore, Store, StoreError};

mod all_rules;
mod one_rule;
mod permit;
mod wait;
pub(crate) use permit::Reservation;
pub(crate) use wait::{Pause, WaitBudget};

pub use all_rules::{AllRules, RuleDecisions};
pub use one_rule::OneRule;
pub use permit::Permit;

/// How many times a delayed request (the layer's delay mode, `wait` on
/// other algorithms than GCRA) is checked again before giving up.
pub const MAX_DELAY_ATTEMPTS: u32 = 8;

/// Rate limits checked by key, without HTTP: one policy, several rules all
/// or nothing ([`Limiter::and`]), with or without a lock-out
/// ([`Limiter::lockout`]). See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let posts = Limiter::new(MemoryStore::new(), Policy::cell(15, 30, Duration::from_secs(60))?)
///     .with_prefix("post");
/// let d = posts.check("user-42").await?;
/// assert_eq!(d.to_cell_reply(), [0, 16, 15, -1, 2]);
/// // The post failed: give its unit back, where it was taken.
/// posts.refund("user-42", &d.receipt().expect("admitted")).await?;
/// assert_eq!(posts.peek("user-42").await?.remaining, 16);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct Limiter<S = MemoryStore, R = OneRule> {
    store: Arc<S>,
    prefix: KeyPrefix,
    rules: R,
    penalty: Option<Arc<Penalty>>,
}

impl<S, R: Clone> Clone for Limiter<S, R> {
    fn clone(&self) -> Self {
        Limiter {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            rules: self.rules.clone(),
            penalty: self.penalty.clone(),
        }
    }
}

impl<S: Store, R> Limiter<S, R> {
    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The lock-out applied, if any.
    pub fn penalty(&self) -> Option<&Penalty> {
        self.penalty.as_deref()
    }

    /// Locks a key out per `penalty` after repeated denials: while locked,
    /// every check of the key is refused without being charged, with
    /// `retry_after` = the time left on the lock; each denial counts a
    /// strike, and the strike that locks answers with the whole lock. See
    /// [`crate::lockout`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::lockout::Penalty;
    /// use tower_throttle::{Limiter, MemoryStore, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// // 3 attempts a minute; 2 refusals within 15 minutes lock the key for an hour.
    /// let logins = Limiter::new(MemoryStore::new(), Policy::sliding_log(3, Duration::from_secs(60))?)
    ///     .lockout(Penalty::new(2, Duration::from_secs(900), Duration::from_secs(3600))?)
    ///     .with_prefix("login");
    /// for _ in 0..3 {
    ///     assert!(logins.check("user-42").await?.allowed);
    /// }
    /// assert!(!logins.check("user-42").await?.allowed); // strike 1
    /// let locked = logins.check("user-42").await?; // strike 2: locked
    /// assert_eq!(locked.retry_after, Some(Duration::from_secs(3600)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Panics
    ///
    /// When the store cannot keep the penalty's strikes or locks
    /// (`CellStore`, `GovernorStore`): [`Limiter::try_lockout`] returns it.
    #[must_use]
    pub fn lockout(self, penalty: Penalty) -> Self {
        self.try_lockout(penalty)
            .unwrap_or_else(|e| panic!("a rate-limit lock-out cannot run on this store: {e}"))
    }

    /// [`Limiter::lockout`], returning the store's refusal of the penalty's
    /// policies instead of panicking.
    pub fn try_lockout(mut self, penalty: Penalty) -> Result<Self, StoreError> {
        penalty.validate(&*self.store).map_err(|(_, e)| e)?;
        self.penalty = Some(Arc::new(penalty));
        Ok(self)
    }

    /// Prepends `prefix:` to every key (a penalty's keys included), so
    /// several limiters can share a store without sharing counters.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = KeyPrefix::new(prefix.as_ref());
        self
    }

    /// The time left on `key`'s lock; `None` when it is not locked (or the
    /// limiter has no lock-out).
    pub async fn locked_for(&self, key: impl AsRef<[u8]>) -> Result<Option<Duration>, StoreError> {
        let key = self.prefix.apply(key.as_ref());
        self.locked(&key).await
    }

    /// Lifts `key`'s lock and forgets its strikes (its quota is untouched).
    pub async fn unlock(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        match &self.penalty {
            Some(penalty) => {
                let key = self.prefix.apply(key.as_ref());
                penalty.unlock(&*self.store, &key).await
            }
            None => Ok(()),
        }
    }

    /// The time left on the lock of `full_key` (`prefix:key`).
    async fn locked(&self, full_key: &[u8]) -> Result<Option<Duration>, StoreError> {
        match &self.penalty {
            Some(penalty) => penalty.check_locked(&*self.store, full_key).await,
            None => Ok(None),
        }
    }

    /// The lock-out's sequence ([`crate::lockout`]) around one check (or
    /// wait) of the caller's `key`, as every check of a limiter takes it:
    /// refused without a store call while the key is locked; a denial the
    /// check ends with counts a strike (a peek, `cost` 0, never does), and
    /// the strike that locks answers with the whole lock. `locked_out`
    /// renders a lock's denial ([`Penalty::lock_denial`]) from the time left
    /// and the denial that locked, if any.
    async fn guarded<T>(
        &self,
        key: &[u8],
        cost: u64,
        check: impl Future<Output = Result<T, StoreError>>,
        denied: impl Fn(&T) -> bool,
        locked_out: impl Fn(&Penalty, Duration, Option<&T>) -> T,
    ) -> Result<T, StoreError> {
        let Some(penalty) = &self.penalty else {
            return check.await;
        };
        let caller = self.prefix.apply(key);
        if let Some(left) = penalty.check_locked(&*self.store, &caller).await? {
            return Ok(locked_out(penalty, left, None));
        }
        let answer = check.await?;
        if !denied(&answer) || cost == 0 {
            return Ok(answer);
        }
        let keys = vec![(0, caller.to_vec())];
        let struck = Arc::clone(penalty)
            .strike_each(self.store.clone(), keys)
            .await;
        let lock = struck.locks.into_iter().next().map(|(_, lock)| lock);
        Ok(match lock.transpose()?.flatten() {
            Some(left) => locked_out(penalty, left, Some(&answer)),
            None => answer,
        })
    }
}

impl<S: Store, R> Limiter<S, R> {
    /// Waits up to `max_wait` for `cost` units of every rule (`keys[i]` under
    /// `policies[i]`), all or nothing, then takes them: what `wait_n` does
    /// for one rule and for several. A GCRA rule reserves its slot at once
    /// when the store can ([`Store::reserves_slots`]) and the wait sleeps
    /// until the latest slot (a waiter dropped before it gives every unit
    /// back); otherwise the check runs again after the longest
    /// `retry_after`, within the budget. One decision per rule, the last
    /// attempt's.
    async fn wait_all(
        &self,
        keys: &[&[u8]],
        policies: &[Policy],
        cost: u64,
        max_wait: Duration,
    ) -> Result<Vec<Decision>, StoreError> {
        retry_within(max_wait, |left| async move {
            // A store that cannot reserve is asked the real policies.
            let reserve = self.store.reserves_slots().then_some(left);
            let used: Vec<Policy> = policies
                .iter()
                .map(|p| effective_policy(p, cost, reserve))
                .collect();
            let charges: Vec<Charge<'_>> = keys
                .iter()
                .zip(&used)
                .map(|(k, p)| Charge::new(k, p, cost))
                .collect();
            let mut decisions = self.store.check_all(&charges).await?;
            if decisions.len() != charges.len() {
                return Err(StoreError::Protocol(format!(
                    "{} decisions for {} rules",
                    decisions.len(),
                    charges.len()
                )));
            }
            let mut slot = Duration::ZERO;
            for ((real, used), d) in policies.iter().zip(&used).zip(&mut decisions) {
                slot = slot.max(rebase(real, used, d));
            }
            if !all_allowed(&decisions) {
                // The longest wait of the denials; one denied for ever
                // ends the wait.
                let retry = decisions
                    .iter()
                    .filter(|d| !d.allowed)
                    .try_fold(Duration::ZERO, |longest, d| {
                        Some(longest.max(d.retry_after?))
                    });
                return Ok(Attempt::Denied(decisions, retry));
            }
            if !slot.is_zero() {
                let charged = keys
                    .iter()
                    .zip(policies)
                    .zip(&decisions)
                    .filter_map(|((k, p), d)| Some((k.to_vec(), *p, d.receipt()?)))
                    .collect();
                let reserved = Reservation::new(self.store.clone(), charged);
                tokio::time::sleep(slot).await;
                reserved.keep();
            }
            Ok(Attempt::Done(decisions))
        })
        .await
    }
}

/// One attempt of a wait: done (admitted), or denied with the wait after
/// which the quota may be there.
enum Attempt<T> {
    Done(T),
    Denied(T, Option<Duration>),
}

/// Runs `attempt` (given the time left) until it admits, or until its
/// denial's wait no longer fits in the [`WaitBudget`] of `max_wait`.
/// Returns the last answer.
async fn retry_within<T, Fut>(
    max_wait: Duration,
    mut attempt: impl FnMut(Duration) -> Fut,
) -> Result<T, StoreError>
where
    Fut: Future<Output = Result<Attempt<T>, StoreError>>,
{
    let mut budget = WaitBudget::new(max_wait);
    loop {
        let (answer, retry) = match attempt(budget.left()).await? {
            Attempt::Done(answer) => return Ok(answer),
            Attempt::Denied(answer, retry) => (answer, retry),
        };
        match budget.pause(retry, false) {
            Some(pause) => budget.take(pause, None).await,
            None => return Ok(answer),
        }
    }
}

/// A rule name: 1 to 64 of `[A-Za-z0-9_.-]` (it is part of store keys and
/// of the `RateLimit` fields, so nothing in it needs escaping).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Panics on a rule name [`Rule::new`](crate::Rule::new) would refuse.
fn assert_valid_name(name: &str) {
    assert!(
        valid_name(name),
        "rate-limit rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
    );
}

/// The `prefix:` a limiter puts before every key.
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
}

#[cfg(test)]
mod tests;
