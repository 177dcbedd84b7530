//! A limiter of several rules, all or nothing: "5 a minute AND 100 a day".

use std::sync::Arc;
use std::time::Duration;

use super::{assert_valid_name, Limiter};
use crate::decision::Decision;
use crate::lockout::Penalty;
use crate::policy::Policy;
use crate::store::{all_allowed, Charge, RuleSpec, Store, StoreError};

/// The rules of a [`Limiter`] that [`Limiter::and`] grew: each must admit
/// a check, all or nothing, in one store call ([`Store::check_all`]), as a
/// [`ThrottleLayer`](crate::ThrottleLayer) with several rules does.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let replies = Limiter::new(MemoryStore::new(), Policy::sliding_log(5, Duration::from_secs(60))?)
///     .named("minute")
///     .and("day", Policy::fixed_window(100, Duration::from_secs(86_400))?);
/// let d = replies.check("user-42").await?;
/// assert!(d.allowed());
/// assert_eq!(d.get("minute").unwrap().remaining, 4);
/// assert_eq!(d.get("day").unwrap().remaining, 99);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct AllRules {
    rules: Arc<[NamedPolicy]>,
}

/// One rule of [`AllRules`]: only the first may lack a name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NamedPolicy {
    name: Option<Arc<str>>,
    policy: Policy,
}

impl NamedPolicy {
    /// The name a [`RuleDecisions`] reports: `""` for an unnamed rule.
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

impl AllRules {
    /// The rules of a one-rule limiter about to grow.
    pub(super) fn of(name: Option<Arc<str>>, policy: Policy) -> Self {
        AllRules {
            rules: Arc::new([NamedPolicy { name, policy }]),
        }
    }
}

/// What every rule of a [`Limiter`] of several rules decided for one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleDecisions {
    rules: Arc<[NamedPolicy]>,
    decisions: Vec<Decision>,
}

impl RuleDecisions {
    /// The decisions of `rules` (name and policy), in their order.
    pub(crate) fn of_rules(
        rules: impl Iterator<Item = (Arc<str>, Policy)>,
        decisions: Vec<Decision>,
    ) -> Self {
        let rules = rules.map(|(name, policy)| NamedPolicy {
            name: Some(name),
            policy,
        });
        RuleDecisions {
            rules: rules.collect(),
            decisions,
        }
    }

    /// True when every rule admitted the check (and its cost was consumed).
    pub fn allowed(&self) -> bool {
        all_allowed(&self.decisions)
    }

    /// Each rule's name (`""` for an unnamed first rule) and decision, in
    /// the order the rules were added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Decision)> + '_ {
        self.rules
            .iter()
            .map(NamedPolicy::name)
            .zip(&self.decisions)
    }

    /// The decision of the rule named `name`.
    pub fn get(&self, name: &str) -> Option<&Decision> {
        self.iter().find(|(n, _)| *n == name).map(|(_, d)| d)
    }

    /// The binding decision: the denial with the longest wait ("never"
    /// longest) if any rule denied, else the rule with the least remaining.
    pub fn decision(&self) -> Decision {
        let denied = self
            .decisions
            .iter()
            .filter(|d| !d.allowed)
            .max_by_key(|d| d.retry_after.unwrap_or(Duration::MAX));
        *denied.unwrap_or_else(|| {
            self.decisions
                .iter()
                .min_by_key(|d| d.remaining)
                .expect("a limiter has at least one rule")
        })
    }

    /// How long until the check would be admitted; `None` when allowed or
    /// never.
    pub fn retry_after(&self) -> Option<Duration> {
        let d = self.decision();
        if d.allowed {
            None
        } else {
            d.retry_after
        }
    }
}

impl<S: Store> Limiter<S, AllRules> {
    /// Adds another rule; every rule must admit a check.
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`](crate::Rule::new) refuses or another rule
    /// already has, or when the store cannot run the rules together
    /// ([`Store::validate`]).
    #[must_use]
    pub fn and(mut self, name: &str, policy: Policy) -> Self {
        assert_valid_name(name);
        assert!(
            self.rules.rules.iter().all(|r| r.name() != name),
            "two rate-limit rules of one limiter are named {name:?}"
        );
        let mut rules = self.rules.rules.to_vec();
        rules.push(NamedPolicy {
            name: Some(name.into()),
            policy,
        });
        let heads: Vec<Vec<u8>> = rules.iter().map(|r| head(r, b"")).collect();
        let specs: Vec<RuleSpec<'_>> = rules
            .iter()
            .zip(&heads)
            .map(|(r, h)| RuleSpec::new(&r.policy, h))
            .collect();
        if let Err(e) = self.store.validate(&specs) {
            panic!("rate-limit rule {name:?} cannot run on this store with the others: {e}");
        }
        self.rules.rules = rules.into();
        self
    }

    /// The rules, in order, by the name a [`RuleDecisions`] reports.
    pub fn rules(&self) -> impl Iterator<Item = (&str, &Policy)> + '_ {
        self.rules.rules.iter().map(|r| (r.name(), &r.policy))
    }

    fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let prefix = self.prefix.with_colon();
        self.rules
            .rules
            .iter()
            .map(|r| [prefix, &head(r, key)].concat())
            .collect()
    }

    /// Charges one unit to `key` under every rule, all or nothing.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<RuleDecisions, StoreError> {
        self.check_n(key, 1).await
    }

    /// Charges `cost` units to `key` under every rule, all or nothing;
    /// refused without charging while the key is locked out, and a denial
    /// counts a strike (see [`Limiter::lockout`]).
    pub async fn check_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<RuleDecisions, StoreError> {
        let key = key.as_ref();
        let check = self.check_rules(key, cost);
        let locked = |penalty: &_, left, struck: Option<&_>| self.locked_out(penalty, left, struck);
        self.guarded(key, cost, check, |d| !d.allowed(), locked)
            .await
    }

    /// Every rule's answer to a lock with `left` to run (what decided the
    /// strike that locked, if any, stays named as the decider).
    fn locked_out(
        &self,
        penalty: &Penalty,
        left: Duration,
        struck: Option<&RuleDecisions>,
    ) -> RuleDecisions {
        let decisions = self
            .rules
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| penalty.lock_denial(&r.policy, left, struck.map(|s| &s.decisions[i])))
            .collect();
        RuleDecisions {
            rules: self.rules.rules.clone(),
            decisions,
        }
    }

    /// The all-or-nothing store call, without the lock-out.
    async fn check_rules(&self, key: &[u8], cost: u64) -> Result<RuleDecisions, StoreError> {
        let keys = self.keys(key);
        let charges: Vec<Charge<'_>> = keys
            .iter()
            .zip(self.rules.rules.iter())
            .map(|(k, r)| Charge::new(k, &r.policy, cost))
            .collect();
        let decisions = self.store.check_all(&charges).await?;
        if decisions.len() != charges.len() {
            return Err(StoreError::Protocol(format!(
                "{} decisions for {} rules",
                decisions.len(),
                charges.len()
            )));
        }
        Ok(RuleDecisions {
            rules: self.rules.rules.clone(),
            decisions,
        })
    }

    /// What a one-unit check would see, without changing anything.
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<RuleDecisions, StoreError> {
        self.check_n(key, 0).await
    }

    /// [`Limiter::wait_n`] of one unit.
    pub async fn wait(
        &self,
        key: impl AsRef<[u8]>,
        max_wait: Duration,
    ) -> Result<RuleDecisions, StoreError> {
        self.wait_n(key, 1, max_wait).await
    }

    /// Waits up to `max_wait` for `cost` units under every rule, all or
    /// nothing, then takes them, as [`Limiter::wait_n`] of one rule does: a
    /// GCRA rule reserves its slot at once (when the store can) and the
    /// wait sleeps until the latest slot, a waiter dropped before it giving
    /// every unit back; otherwise the check runs again after the longest
    /// `retry_after` of the rules. Returns the admitting decisions, or the
    /// denial when the units cannot come within `max_wait`. A locked-out
    /// key is refused at once; a wait that ends denied counts one strike.
    /// Needs a tokio runtime with time enabled.
    pub async fn wait_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<RuleDecisions, StoreError> {
        let key = key.as_ref();
        let keys = self.keys(key);
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let policies: Vec<Policy> = self.rules.rules.iter().map(|r| r.policy).collect();
        let waited = async {
            let decisions = self.wait_all(&keys, &policies, cost, max_wait).await?;
            Ok(RuleDecisions {
                rules: self.rules.rules.clone(),
                decisions,
            })
        };
        let locked = |penalty: &_, left, struck: Option<&_>| self.locked_out(penalty, left, struck);
        self.guarded(key, cost, waited, |d| !d.allowed(), locked)
            .await
    }

    /// Gives an admitted check's units back to `key` under every rule, each
    /// into the slot where it was taken (see [`Limiter::refund`]). A denied
    /// check took nothing and gives nothing back.
    pub async fn refund(
        &self,
        key: impl AsRef<[u8]>,
        checked: &RuleDecisions,
    ) -> Result<(), StoreError> {
        let keys = self.keys(key.as_ref());
        for ((k, r), d) in keys
            .iter()
            .zip(self.rules.rules.iter())
            .zip(&checked.decisions)
        {
            if let Some(receipt) = &d.receipt() {
                self.store.refund(k, &r.policy, receipt).await?;
            }
        }
        Ok(())
    }

    /// Forgets everything about `key` under every rule: quotas, and its
    /// strikes and lock if the limiter has a lock-out.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let key = key.as_ref();
        for (k, r) in self.keys(key).iter().zip(self.rules.rules.iter()) {
            self.store.reset(k, &r.policy).await?;
        }
        self.unlock(key).await
    }
}

/// A rule's key of the caller's `key`, after the prefix: `[name:]key`.
fn head(rule: &NamedPolicy, key: &[u8]) -> Vec<u8> {
    match &rule.name {
        None => key.to_vec(),
        Some(name) => [name.as_bytes(), b":", key].concat(),
    }
}
