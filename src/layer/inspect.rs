//! Reading and clearing a key's state under every rule of a
//! [`ThrottleLayer`], outside of requests: support tooling, admin
//! endpoints, tests.

use super::ThrottleLayer;
use crate::key::{bound_key_part, MAX_KEY_PART};
use crate::limiter::RuleDecisions;
use crate::store::{Charge, Store, StoreError};

impl<St: Store> ThrottleLayer<St> {
    /// What a request whose key is `key` (the part the rules' extractors
    /// write: a header's value, a client address as text) would see under
    /// each rule, without charging anything: each rule's
    /// [`Decision`](crate::Decision) of a check of cost 0, by rule name:
    /// `remaining` says how many units a request could take.
    /// Rules take their own policy (a per-request policy is the request's
    /// to choose); a lock-out is read with
    /// [`Limiter::locked_for`](crate::Limiter::locked_for).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::HeaderKey, MemoryStore, Policy, ThrottleLayer};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(5, Duration::from_secs(60))?)
    ///     .key(HeaderKey::new(http::HeaderName::from_static("x-user")));
    /// let state = layer.peek("user-42").await?;
    /// assert_eq!(state.get("default").unwrap().remaining, 5);
    /// layer.reset("user-42").await?; // forgets the key under every rule
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn peek(&self, key: impl AsRef<[u8]>) -> Result<RuleDecisions, StoreError> {
        let keys = self.rule_keys(key.as_ref());
        let charges: Vec<Charge<'_>> = (self.limits.iter())
            .zip(&keys)
            .map(|(rule, key)| Charge::new(key, &rule.policy, 0))
            .collect();
        let decisions = self.store.check_all(&charges).await?;
        let names = self.limits.iter().map(|r| (r.name.clone(), r.policy));
        Ok(RuleDecisions::of_rules(names, decisions))
    }

    /// Forgets `key` under every rule (a support action: a user wrongly
    /// limited gets a fresh quota at once).
    pub async fn reset(&self, key: impl AsRef<[u8]>) -> Result<(), StoreError> {
        let keys = self.rule_keys(key.as_ref());
        for (rule, key) in self.limits.iter().zip(&keys) {
            self.store.reset(key, &rule.policy).await?;
        }
        Ok(())
    }

    /// Every rule's store key for the key part `key`, as a request builds it.
    fn rule_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        (self.limits.iter())
            .map(|rule| {
                let mut full = self.key_head(rule);
                let part = full.len();
                full.extend_from_slice(key);
                bound_key_part(&mut full, part, MAX_KEY_PART);
                full
            })
            .collect()
    }
}
