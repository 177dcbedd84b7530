//! Rules: a policy, a key and a cost.

use std::fmt;
use std::sync::Arc;

use crate::key::{KeyExtractor, RequestHead};
use crate::limiter::valid_name;
use crate::meter::ActualCost;
use crate::policy::Policy;
use crate::resolve::{PolicyResolver, PolicySource};
use crate::response::fields::QuotaUnit;

/// One limit a [`ThrottleLayer`](crate::ThrottleLayer) enforces: a named
/// policy, and optionally its own key extractor and cost (else the layer's).
///
/// The name appears in the `RateLimit` headers and in the store key
/// (`prefix:name:key`), so rules of one layer never share a counter.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{key::BearerToken, Policy, Rule};
///
/// let daily = Rule::new("day", Policy::fixed_window(100, Duration::from_secs(86_400))?)
///     .key(BearerToken)
///     .cost(1);
/// # let _ = daily;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone)]
#[must_use = "builders do nothing until used"]
pub struct Rule {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Policy,
    pub(crate) key: Option<Arc<dyn KeyExtractor>>,
    pub(crate) cost: Option<Cost>,
    pub(crate) source: Option<PolicySource>,
    pub(crate) actual: Option<ActualCost>,
    pub(crate) quota_unit: Option<QuotaUnit>,
}

impl Rule {
    /// A limit named `name` applying `policy`.
    ///
    /// # Panics
    ///
    /// When `name` is empty, longer than 64 bytes, or holds anything but
    /// ASCII letters, digits, `-`, `_` and `.` (a configuration error).
    pub fn new(name: &str, policy: Policy) -> Self {
        assert!(
            valid_name(name),
            "rate-limit rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
        );
        Rule {
            name: name.into(),
            policy,
            key: None,
            cost: None,
            source: None,
            actual: None,
            quota_unit: None,
        }
    }

    /// The key of this rule (default: the layer's).
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Some(Arc::new(key));
        self
    }

    /// The units each request costs (default: the layer's, 1). 0 only peeks.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(Cost::Fixed(cost));
        self
    }

    /// The units a request costs, computed from it.
    pub fn cost_fn(mut self, f: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Cost::Fn(Arc::new(f)));
        self
    }

    /// Charges [`cost`](Self::cost) (or [`cost_fn`](Self::cost_fn)) as an
    /// estimate at admission, and settles the request's actual cost from
    /// its response (see [`crate::meter`]): bytes sent, or a number the
    /// handler reports. An estimate below 1 is charged as 1, so a request
    /// on a spent quota is refused whatever estimate it brings.
    pub fn settle_cost(mut self, actual: ActualCost) -> Self {
        self.actual = Some(actual);
        self
    }

    /// What this rule's quota counts, announced as the `qu` parameter of its
    /// `RateLimit-Policy` item (default: requests, or concurrent requests for
    /// a concurrency policy). A byte quota charges each request its size
    /// (a [`cost_fn`](Self::cost_fn) reading `Content-Length`, say) and says
    /// so with [`QuotaUnit::ContentBytes`]: `qu="content-bytes"`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::response::QuotaUnit;
    /// use tower_throttle::{Policy, Rule};
    ///
    /// // 10 MB of uploads a minute.
    /// let upload = Rule::new("upload", Policy::sliding_window(10_000_000, Duration::from_secs(60))?)
    ///     .cost_fn(|req| {
    ///         let length = req.headers().get(http::header::CONTENT_LENGTH);
    ///         length.and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0)
    ///     })
    ///     .quota_unit(QuotaUnit::ContentBytes);
    /// # let _ = upload;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn quota_unit(mut self, unit: QuotaUnit) -> Self {
        self.quota_unit = Some(unit);
        self
    }

    /// Takes the policy from the request: `f` returns the policy to apply,
    /// or `None` for the rule's own (the default tier). Called once per
    /// request; keep it cheap (read an extension, match a tier). See
    /// [`crate::resolve`] for what happens to a key whose policy changes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{Policy, Rule};
    ///
    /// let premium = Policy::sliding_window(50, Duration::from_secs(60))?;
    /// let replies = Rule::new("reply", Policy::sliding_window(5, Duration::from_secs(60))?)
    ///     .policy_fn(move |req| req.headers().contains_key("x-premium").then_some(premium));
    /// # let _ = replies;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn policy_fn(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        self.source = Some(PolicySource::Fn(Arc::new(f)));
        self
    }

    /// Takes the policy from a `T` an earlier layer (authentication) put in
    /// the request extensions: `f` maps it to a policy, or `None` for the
    /// rule's own. Without a `T`, the rule's own policy applies.
    pub fn policy_from_extension<T: Send + Sync + 'static>(
        self,
        f: impl Fn(&T) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        self.policy_fn(move |req| req.extensions().get::<T>().and_then(&f))
    }

    /// Asks `resolver` for the policy of each request's key (a quota in a
    /// database; wrap it in a [`CachedResolver`](crate::resolve::CachedResolver)).
    /// A request whose policy is not cached takes the asynchronous path.
    pub fn resolver(mut self, resolver: impl PolicyResolver) -> Self {
        self.source = Some(PolicySource::Resolver(Arc::new(resolver)));
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's own policy (the default when the request chooses none).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// A request's cost.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u64),
    Fn(Arc<dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync>),
}

impl Cost {
    #[inline]
    pub(crate) fn of(&self, req: &RequestHead<'_>) -> u64 {
        match self {
            Cost::Fixed(n) => *n,
            Cost::Fn(f) => f(req),
        }
    }

    /// This cost, never below 1: a settled rule's estimate. A check of 0
    /// units is a peek, admitted on a spent quota; an estimate of 1 or more
    /// is refused there, so a client choosing an estimate of 0 cannot slip
    /// past the limit (see [`crate::meter`]).
    pub(crate) fn at_least_one(self) -> Cost {
        match self {
            Cost::Fixed(n) => Cost::Fixed(n.max(1)),
            Cost::Fn(f) => Cost::Fn(Arc::new(move |req| f(req).max(1))),
        }
    }
}

/// A rule resolved against the layer's defaults.
pub(crate) struct RuleCfg {
    /// `prefix:name:`, the start of every key of this rule.
    pub(crate) key_head: Box<[u8]>,
    pub(crate) policy: Policy,
    pub(crate) key: Arc<dyn KeyExtractor>,
    pub(crate) cost: Cost,
    pub(crate) source: Option<PolicySource>,
    /// Where the actual cost comes from, if settled after the response.
    pub(crate) actual: Option<ActualCost>,
}

/// A rule the store refused before any traffic: see
/// [`ThrottleLayer::validate`](crate::ThrottleLayer::validate).
#[derive(Debug)]
pub struct RuleError {
    pub(crate) rules: Vec<Arc<str>>,
    // Boxed: the error travels in a `Result` of every build path.
    pub(crate) policy: Option<Box<Policy>>,
    pub(crate) error: Box<crate::store::StoreError>,
}

impl RuleError {
    /// The names of the rules refused: one, or all of a layer's rules when
    /// they cannot run together (one all-or-nothing check).
    pub fn rules(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| &**r)
    }

    /// The policy refused, when one rule was.
    pub fn policy(&self) -> Option<&Policy> {
        self.policy.as_deref()
    }

    /// The store's reason.
    pub fn store_error(&self) -> &crate::store::StoreError {
        &self.error
    }
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.rules[..], &self.policy) {
            ([rule], Some(p)) => write!(
                f,
                "rate-limit rule `{rule}` ({:?}) cannot run on this store: {}",
                p.algorithm(),
                self.error
            ),
            (rules, _) => {
                f.write_str("rate-limit rules ")?;
                for (i, r) in rules.iter().enumerate() {
                    write!(f, "{}`{r}`", if i == 0 { "" } else { ", " })?;
                }
                write!(f, " cannot run together on this store: {}", self.error)
            }
        }
    }
}

impl std::error::Error for RuleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}
