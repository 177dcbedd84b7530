//! The [`Store`] impl of [`FallbackStore`]: each call routed, the fallback's
//! answers adopted, lock-out state kept in both stores.

use super::route::{within_share, Route};
use super::FallbackStore;
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::store::{Charge, Namespaces, RuleSpec, Store, StoreError};

/// Counts a check the fallback decided (feature `metrics`).
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
