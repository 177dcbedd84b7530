//! A limiter of one rule: checks answer a [`Decision`].

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::{assert_valid_name, AllRules, KeyPrefix, Limiter, Permit};
use crate::decision::{Decision, PermitId, Receipt};
use crate::lockout::Penalty;
use crate::policy::Policy;
use crate::store::{Charge, RuleSpec, Store, StoreError};

/// The one rule of a [`Limiter`] built by [`Limiter::new`]: a policy, and
/// optionally a name ([`Limiter::named`]).
#[derive(Clone, Debug)]
pub struct OneRule {
    pub(super) policy: Policy,
    pub(super) name: Option<Arc<str>>,
}

impl<S: Store> Limiter<S, OneRule> {
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
        Self::try_from_shared(store, policy).unwrap_or_else(|e| refused(&policy, &e))
    }

    /// [`Limiter::from_shared`], returning the store's refusal of `policy`.
    pub fn try_from_shared(store: Arc<S>, policy: Policy) -> Result<Self, StoreError> {
        store.validate(&[RuleSpec::new(&policy, b"")])?;
        Ok(Limiter {
            store,
            prefix: KeyPrefix::default(),
            rules: OneRule { policy, name: None },
            penalty: None,
        })
    }

    /// Names the rule: its keys become `prefix:name:key`, and
    /// [`RuleDecisions`](super::RuleDecisions) report it by that name once
    /// [`Limiter::and`] adds another.
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`](crate::Rule::new) refuses.
    #[must_use]
    pub fn named(mut self, name: &str) -> Self {
        assert_valid_name(name);
        self.rules.name = Some(name.into());
        self
    }

    /// Adds a rule named `name` that must admit every check too: checks
    /// become all or nothing over both rules, in one store call
    /// ([`Store::check_all`]), and answer one decision per rule. This
    /// limiter's own rule keeps its keys (and its name, if any: unnamed, it
    /// reports as `""`).
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`](crate::Rule::new) refuses or the first rule
    /// has, or when the store cannot run the two rules together.
    #[must_use]
    pub fn and(self, name: &str, policy: Policy) -> Limiter<S, AllRules> {
        let first = self.rules;
        Limiter {
            store: self.store,
            prefix: self.prefix,
            rules: AllRules::of(first.name, first.policy),
            penalty: self.penalty,
        }
        .and(name, policy)
    }

    /// The policy applied.
    pub fn policy(&self) -> &Policy {
        &self.rules.policy
    }

    /// The store key of the caller's `key`: `prefix:[name:]key`.
    fn rule_key<'k>(&self, key: &'k [u8]) -> Cow<'k, [u8]> {
        match &self.rules.name {
            None => self.prefix.apply(key),
            Some(name) => {
                Cow::Owned([self.prefix.with_colon(), name.as_bytes(), b":", key].concat())
            }
        }
    }

    /// Charges one unit to `key`.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<Decision, StoreError> {
        self.check_n(key, 1).await
    }

    /// Charges `cost` units to `key`; denied (consuming nothing) if they do
    /// not fit, or while the key is locked out.
    ///
    /// For a concurrency policy an admitted check holds a permit until
    /// [`Limiter::release`] or the lease ends; prefer [`Limiter::acquire`].
    pub async fn check_n(&self, key: impl AsRef<[u8]>, cost: u64) -> Result<Decision, StoreError> {
        let key = key.as_ref();
        let rule_key = self.rule_key(key);
        self.decide(key, &rule_key, &self.rules.policy, cost).await
    }

    /// One check of `rule_key` under the lock-out, if any, of the caller's
    /// `key`: refused while locked; a denial counts a strike (a peek never
    /// does), and the strike that locks answers with the whole lock.
    async fn decide(
        &self,
        key: &[u8],
        rule_key: &[u8],
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let charge = Charge::new(rule_key, policy, cost);
        let check = self.store.check(charge);
        let locked =
            |penalty: &Penalty, left, struck: Option<&_>| penalty.lock_denial(policy, left, struck);
        self.guarded(key, cost, check, |d| !d.allowed, locked).await
    }

    /// Charges `cost` units of `policy` to `key`: a policy chosen per call
    /// (a customer's tier). `key`'s state is shared with this limiter's
    /// own policy as described in [`crate::resolve`]: carried over for GCRA,
    /// sliding logs, concurrency and windows of the same length, separate
    /// otherwise. Refund, reset and release such a check with the `_with`
    /// variants and the same policy. A lock-out applies as to
    /// [`Limiter::check_n`].
    pub async fn check_with(
        &self,
        key: impl AsRef<[u8]>,
        policy: &Policy,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        let key = key.as_ref();
        let rule_key = self.key_for(key, policy);
        self.decide(key, &rule_key, policy, cost).await
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

    /// [`Limiter::reset`] of a [`Limiter::check_with`] (the lock-out, if
    /// any, is untouched: see [`Limiter::unlock`]).
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
        if !policy.write_state_tag(&self.rules.policy, &mut tag) {
            return self.rule_key(key);
        }
        let head = self.rule_key(b"");
        let head = &head[..head.len().saturating_sub(1)];
        let mut out = Vec::with_capacity(head.len() + tag.len() + key.len() + 1);
        out.extend_from_slice(head);
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
    /// budget (a competing caller may take the quota first). A locked-out
    /// key is refused at once; a wait that ends denied counts one strike.
    /// Needs a tokio runtime with time enabled.
    pub async fn wait_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        let caller = key.as_ref();
        let real = self.rules.policy;
        let key = self.rule_key(caller);
        let waited = async {
            let mut decisions = self.wait_all(&[&key], &[real], cost, max_wait).await?;
            decisions
                .pop()
                .ok_or_else(|| StoreError::Protocol("no decision for the rule".into()))
        };
        let locked =
            |penalty: &Penalty, left, struck: Option<&_>| penalty.lock_denial(&real, left, struck);
        self.guarded(caller, cost, waited, |d| !d.allowed, locked)
            .await
    }

    /// What a one-unit check would see, without changing anything (a
    /// locked-out key reads as locked).
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<Decision, StoreError> {
        self.check_n(key, 0).await
    }

    /// Forgets everything about `key`: its quota, and its strikes and lock
    /// if the limiter has a lock-out.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = key.as_ref();
        let rule_key = self.rule_key(key);
        self.store.reset(&rule_key, &self.rules.policy).await?;
        self.unlock(key).await
    }

    /// Gives an admitted check's units back to `key`, into the slot where
    /// they were taken ([`Decision::receipt`]; [`Receipt::part`] for some
    /// of them): a charge whose window has ended, or whose GCRA debt is
    /// already paid off, gives nothing back, so a refund never lets more
    /// through than the limit. Strikes already counted stay. See
    /// [`Store::refund`].
    pub async fn refund(&self, key: impl AsRef<[u8]>, receipt: &Receipt) -> Result<(), StoreError> {
        let key = self.rule_key(key.as_ref());
        self.store.refund(&key, &self.rules.policy, receipt).await
    }

    /// Releases a permit returned in [`Decision::permit`].
    pub async fn release(&self, key: impl AsRef<[u8]>, permit: PermitId) -> Result<(), StoreError> {
        let key = self.rule_key(key.as_ref());
        self.store.release(&key, &self.rules.policy, permit).await
    }

    /// Takes a concurrency permit, released when the returned guard drops.
    /// `Ok(Err(decision))` when denied (or locked out).
    pub async fn acquire(
        &self,
        key: impl AsRef<[u8]>,
    ) -> Result<Result<Permit<S>, Decision>, StoreError> {
        let key = key.as_ref();
        let rule_key = self.rule_key(key).into_owned();
        let decision = self.decide(key, &rule_key, &self.rules.policy, 1).await?;
        if !decision.allowed {
            return Ok(Err(decision));
        }
        Ok(Ok(Permit::new(
            self.store.clone(),
            self.rules.policy,
            rule_key,
            decision,
        )))
    }
}

/// The panic of a constructor whose store refuses `policy`.
fn refused(policy: &Policy, error: &StoreError) -> ! {
    panic!(
        "rate-limit policy {:?} cannot run on this store: {error}",
        policy.algorithm()
    )
}
