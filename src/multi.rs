//! The direct API over several rules: "5 a minute AND 100 a day".

use std::sync::Arc;
use std::time::Duration;

use crate::decision::Decision;
use crate::limiter::KeyPrefix;
use crate::limiter::{valid_name, MAX_DELAY_ATTEMPTS};
use crate::policy::Policy;
use crate::store::{all_allowed, Charge, MemoryStore, Store, StoreError};

/// Several named policies over one store, checked together by key: all or
/// nothing, in one store call ([`Store::check_all`]), as a
/// [`ThrottleLayer`](crate::ThrottleLayer) with several rules does.
///
/// Each rule's key is `prefix:name:key` (no `prefix:` unless set). Clones
/// share the store.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{MemoryStore, MultiLimiter, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let replies = MultiLimiter::new(MemoryStore::new(), "minute", Policy::sliding_log(5, Duration::from_secs(60))?)
///     .and("day", Policy::fixed_window(100, Duration::from_secs(86_400))?);
/// let d = replies.check("laoqian").await?;
/// assert!(d.allowed());
/// assert_eq!(d.get("minute").unwrap().remaining, 4);
/// assert_eq!(d.get("day").unwrap().remaining, 99);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
pub struct MultiLimiter<S = MemoryStore> {
    store: Arc<S>,
    prefix: KeyPrefix,
    rules: Arc<[(Arc<str>, Policy)]>,
}

impl<S> Clone for MultiLimiter<S> {
    fn clone(&self) -> Self {
        MultiLimiter {
            store: self.store.clone(),
            prefix: self.prefix.clone(),
            rules: self.rules.clone(),
        }
    }
}

/// What every rule of a [`MultiLimiter`] decided for one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDecision {
    rules: Arc<[(Arc<str>, Policy)]>,
    decisions: Vec<Decision>,
}

impl MultiDecision {
    /// True when every rule admitted the check (and its cost was consumed).
    pub fn allowed(&self) -> bool {
        all_allowed(&self.decisions)
    }

    /// Each rule's name and decision, in the order the rules were added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Decision)> + '_ {
        self.rules
            .iter()
            .map(|(name, _)| &**name)
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
                .expect("a multi-limiter has at least one rule")
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

impl<S: Store> MultiLimiter<S> {
    /// A limiter with one rule, `name` applying `policy`; add more with
    /// [`MultiLimiter::and`].
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`](crate::Rule::new) refuses.
    pub fn new(store: S, name: &str, policy: Policy) -> Self {
        Self::from_shared(Arc::new(store), name, policy)
    }

    /// [`MultiLimiter::new`] over a store shared with other limiters.
    pub fn from_shared(store: Arc<S>, name: &str, policy: Policy) -> Self {
        MultiLimiter {
            store,
            prefix: KeyPrefix::default(),
            rules: Arc::new([]),
        }
        .and(name, policy)
    }

    /// Adds a rule; every rule must admit a check.
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`](crate::Rule::new) refuses, or one another
    /// rule already has.
    #[must_use]
    pub fn and(mut self, name: &str, policy: Policy) -> Self {
        assert!(
            valid_name(name),
            "rate-limit rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
        );
        assert!(
            self.rules.iter().all(|(n, _)| &**n != name),
            "two rate-limit rules of one limiter are named {name:?}"
        );
        let mut rules = self.rules.to_vec();
        rules.push((name.into(), policy));
        self.rules = rules.into();
        self
    }

    /// Prepends `prefix:` to every key.
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = KeyPrefix::new(prefix.as_ref());
        self
    }

    /// The rules, in order.
    pub fn rules(&self) -> impl Iterator<Item = (&str, &Policy)> + '_ {
        self.rules.iter().map(|(n, p)| (&**n, p))
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    fn keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        let prefix = self.prefix.with_colon();
        self.rules
            .iter()
            .map(|(name, _)| [prefix, name.as_bytes(), b":", key].concat())
            .collect()
    }

    /// Charges one unit to `key` under every rule, all or nothing.
    pub async fn check(&self, key: impl AsRef<[u8]>) -> Result<MultiDecision, StoreError> {
        self.check_n(key, 1).await
    }

    /// Charges `cost` units to `key` under every rule, all or nothing.
    pub async fn check_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
    ) -> Result<MultiDecision, StoreError> {
        let keys = self.keys(key.as_ref());
        let rules: Vec<Charge<'_>> = keys
            .iter()
            .zip(self.rules.iter())
            .map(|(k, (_, policy))| Charge::new(k, policy, cost))
            .collect();
        let decisions = self.store.check_all(&rules).await?;
        if decisions.len() != rules.len() {
            return Err(StoreError::Protocol(format!(
                "{} decisions for {} rules",
                decisions.len(),
                rules.len()
            )));
        }
        Ok(MultiDecision {
            rules: self.rules.clone(),
            decisions,
        })
    }

    /// What a one-unit check would see, without changing anything.
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<MultiDecision, StoreError> {
        self.check_n(key, 0).await
    }

    /// Waits up to `max_wait` for `cost` units under every rule, checking
    /// again after each denial's `retry_after` (the longest of the rules'),
    /// then takes them. Returns the admitting decision, or the denial when
    /// the units cannot come within `max_wait`. Needs a tokio runtime with
    /// time enabled.
    pub async fn wait_n(
        &self,
        key: impl AsRef<[u8]>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<MultiDecision, StoreError> {
        let key = key.as_ref();
        let mut waited = Duration::ZERO;
        let mut attempts = 0;
        loop {
            let d = self.check_n(key, cost).await?;
            let left = max_wait.saturating_sub(waited);
            match d.retry_after() {
                Some(retry) if retry <= left && attempts < MAX_DELAY_ATTEMPTS => {
                    attempts += 1;
                    let retry = retry.max(Duration::from_millis(1));
                    tokio::time::sleep(retry).await;
                    waited += retry;
                }
                _ => return Ok(d),
            }
        }
    }

    /// Gives an admitted check's units back to `key` under every rule, each
    /// into the slot where it was taken (see [`Limiter::refund`]). A denied
    /// check took nothing and gives nothing back.
    ///
    /// [`Limiter::refund`]: crate::Limiter::refund
    pub async fn refund(
        &self,
        key: impl AsRef<[u8]>,
        checked: &MultiDecision,
    ) -> Result<(), StoreError> {
        let keys = self.keys(key.as_ref());
        for ((k, (_, policy)), d) in keys.iter().zip(self.rules.iter()).zip(&checked.decisions) {
            if let Some(receipt) = &d.receipt() {
                self.store.refund(k, policy, receipt).await?;
            }
        }
        Ok(())
    }

    /// Forgets `key` under every rule.
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        for (k, (_, policy)) in self.keys(key.as_ref()).iter().zip(self.rules.iter()) {
            self.store.reset(k, policy).await?;
        }
        Ok(())
    }
}
