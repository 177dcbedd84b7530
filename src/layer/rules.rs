//! Builder methods of [`ThrottleLayer`]: its rules, keys, costs, policies
//! and key namespace.

use std::sync::Arc;

use super::ThrottleLayer;
use crate::key::{KeyExtractor, RequestHead};
use crate::limiter::valid_name;
use crate::policy::Policy;
use crate::rule::{Cost, Rule};
use crate::store::Store;

impl<St: Store> ThrottleLayer<St> {
    /// Renames the first rule (the one given to [`Self::new`]).
    ///
    /// # Panics
    ///
    /// On a name [`Rule::new`] refuses or one another rule already has.
    pub fn name(mut self, name: &str) -> Self {
        let first = Rule {
            name: name.into(),
            ..self.limits.remove(0)
        };
        assert!(
            valid_name(name),
            "rate-limit rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
        );
        self.push(first, 0)
    }

    /// Adds a rule; every rule must admit a request (checked in one store
    /// call, all or nothing), and a denial reports the longest wait.
    ///
    /// # Panics
    ///
    /// When another rule of the layer has the same name.
    pub fn and(self, limit: Rule) -> Self {
        let at = self.limits.len();
        self.push(limit, at)
    }

    fn push(mut self, limit: Rule, at: usize) -> Self {
        self.owner = Arc::new(());
        assert!(
            self.limits.iter().all(|l| l.name != limit.name),
            "two rate-limit rules of one layer are named {:?}",
            limit.name
        );
        self.limits.insert(at, limit);
        self
    }

    /// The key of every rule that has none of its own (default [`PeerIp`](crate::key::PeerIp)).
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.owner = Arc::new(());
        self.key = Arc::new(key);
        self
    }

    /// The cost of a request for every rule without its own (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// The cost of a request, computed from it, for every rule without its own.
    pub fn cost_fn(mut self, f: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Cost::Fn(Arc::new(f));
        self
    }

    /// Settles the first rule's cost after the response (see
    /// [`Rule::settle_cost`]): its cost is the estimate charged at admission.
    pub fn settle_cost(mut self, actual: crate::meter::ActualCost) -> Self {
        let first = self.limits.remove(0).settle_cost(actual);
        self.limits.insert(0, first);
        self
    }

    /// Takes the first rule's policy from the request (see
    /// [`Rule::policy_fn`]): `None` keeps the rule's own.
    pub fn policy_fn(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        let first = self.limits.remove(0).policy_fn(f);
        self.limits.insert(0, first);
        self
    }

    /// Takes the first rule's policy from a `T` in the request extensions,
    /// set by an authentication layer (see [`Rule::policy_from_extension`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::FromExtension, MemoryStore, Policy, ThrottleLayer};
    ///
    /// #[derive(Clone)]
    /// enum Tier { Free, Premium }
    ///
    /// let premium = Policy::sliding_window(50, Duration::from_secs(60))?;
    /// let replies = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(5, Duration::from_secs(60))?)
    ///     .name("reply")
    ///     .policy_from_extension(move |tier: &Tier| match tier {
    ///         Tier::Premium => Some(premium),
    ///         Tier::Free => None, // the layer's own: 5 a minute
    ///     });
    /// # let _ = replies;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn policy_from_extension<T: Send + Sync + 'static>(
        mut self,
        f: impl Fn(&T) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        let first = self.limits.remove(0).policy_from_extension(f);
        self.limits.insert(0, first);
        self
    }

    /// What the first rule's quota counts (see [`Rule::quota_unit`]).
    pub fn quota_unit(mut self, unit: crate::response::fields::QuotaUnit) -> Self {
        let first = self.limits.remove(0).quota_unit(unit);
        self.limits.insert(0, first);
        self
    }

    /// Prepends `prefix:` to every key of this layer.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.owner = Arc::new(());
        self.prefix = Some(prefix.into());
        self
    }

    /// Lets this layer use the counters of another layer on the same store
    /// with the same `prefix:rule-name` (one budget over several routes or
    /// stacks, on purpose). Without it, building such a second layer panics.
    pub fn share_counters(mut self) -> Self {
        self.shared_namespace = true;
        self
    }
}
