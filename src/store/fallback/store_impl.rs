//! The [`Store`] impl of [`FallbackStore`]: each call routed, the fallback's
//! answers adopted, lock-out state kept in both stores.

use std::future::{Future, IntoFuture};

use super::route::{within_share, Route};
use super::FallbackStore;
use crate::decision::{DecidedBy, Decision, PermitId, Receipt};
use crate::policy::Policy;
use crate::store::probe::ProbeGuard;
use crate::store::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};

/// Counts a check the fallback decided (feature `metrics`).
fn count_fallback() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_throttle_fallback_total").increment(1);
}

impl<P: Store, F: Store> FallbackStore<P, F> {
    /// The check in process, when the route's store answers so (`None`:
    /// through [`decide_later`](Self::decide_later), nothing charged yet).
    fn decide_now(
        &self,
        route: &Route<'_>,
        charges: &[Charge<'_>],
    ) -> Option<Result<Decisions, StoreError>> {
        match route {
            // While the primary is down an in-process fallback decides
            // without a future, as it would alone.
            Route::Fallback => match self.fallback.decide(charges) {
                Answer::Now(result) => {
                    count_fallback();
                    Some(result.map(|ds| self.adopt_all(charges, ds)))
                }
                Answer::Later(_) => None,
            },
            // A probe needs the asynchronous path (and its claim).
            Route::Primary(Some(_)) => None,
            Route::Primary(None) => match self.primary.decide(charges) {
                Answer::Later(_) => None,
                Answer::Now(Err(e)) if e.is_unavailable() => {
                    self.shared.primary_failed(&e);
                    None
                }
                Answer::Now(Ok(mut ds)) => {
                    if let ([charge], [d]) = (charges, &mut ds[..]) {
                        if mirrored(charge, d) {
                            // Mirrored when the fallback answers in process
                            // (the primary has charged already: no second
                            // try later).
                            if let Answer::Now(m) = self.fallback.decide(charges) {
                                *d = self.stricter(*charge, *d, m.and_then(Decisions::into_one));
                            }
                        }
                    }
                    Some(Ok(ds))
                }
                Answer::Now(Err(e)) => Some(Err(e)),
            },
        }
    }

    /// The check through the stores' futures, on a probe's claim or on the
    /// route taken now.
    async fn decide_later(
        &self,
        probe: Option<ProbeGuard<'_>>,
        charges: &[Charge<'_>],
    ) -> Result<Decisions, StoreError> {
        let route = probe.map_or_else(|| self.shared.route(), |p| Route::Primary(Some(p)));
        let Route::Primary(_claim) = route else {
            return self.fallback_decide(charges).await;
        };
        match within_share(self.primary.decide(charges).into_future()).await {
            Ok(mut ds) => {
                self.shared.primary_answered();
                if let ([charge], [d]) = (charges, &mut ds[..]) {
                    if mirrored(charge, d) {
                        let m = self.fallback.check(*charge).await;
                        *d = self.stricter(*charge, *d, m);
                    }
                }
                Ok(ds)
            }
            Err(e) if e.is_unavailable() => {
                self.shared.primary_failed(&e);
                self.fallback_decide(charges).await
            }
            Err(e) => Err(e),
        }
    }

    async fn fallback_decide(&self, charges: &[Charge<'_>]) -> Result<Decisions, StoreError> {
        count_fallback();
        let ds = self.fallback.decide(charges).await?;
        Ok(self.adopt_all(charges, ds))
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

    fn adopt_all(&self, charges: &[Charge<'_>], mut ds: Decisions) -> Decisions {
        for (d, c) in ds.iter_mut().zip(charges) {
            *d = self.shared.adopt(c.policy, *d);
        }
        ds
    }
}

/// Lock-out state lives in both stores, so that a lock announced by either
/// holds whichever decides later: an admitted charge of it on the primary
/// is made on the fallback too, and a peek of it reads both and answers
/// the stricter.
fn mirrored(charge: &Charge<'_>, d: &Decision) -> bool {
    charge.penalty && (charge.cost == 0 || d.allowed)
}

impl<P: Store, F: Store> Store for FallbackStore<P, F> {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        let route = self.shared.route();
        if let Some(now) = self.decide_now(&route, charges) {
            return Answer::Now(now);
        }
        let probe = match route {
            Route::Primary(probe) => probe,
            Route::Fallback => None,
        };
        Answer::later(self.decide_later(probe, charges))
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
