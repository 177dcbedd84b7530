//! Policies chosen per request: tiers, negotiated quotas.
//!
//! A [`Rule`](crate::Rule) normally applies one policy to every key. With
//! [`Rule::policy_fn`](crate::Rule::policy_fn) (or
//! [`Rule::policy_from_extension`](crate::Rule::policy_from_extension)) it
//! takes the policy from the request, synchronously: a tier an
//! authentication layer put in the extensions. With
//! [`Rule::resolver`](crate::Rule::resolver) it asks a [`PolicyResolver`]
//! with the rule's key (an API key, a customer id), asynchronously: a quota
//! in a database, behind a [`CachedResolver`] so that the hot path reads a
//! bounded in-process cache and not the database. `None` from either means
//! the rule's own policy (the default tier).
//!
//! The `RateLimit-Policy` field, the 429 and
//! [`RateLimitInfo`](crate::RateLimitInfo) show the policy actually applied.
//! The direct API takes a policy per call:
//! [`Limiter::check_with`](crate::Limiter::check_with).
//!
//! # A key whose policy changes
//!
//! A customer upgraded mid-window keeps their history; the new limit
//! judges it. Per algorithm, on every store:
//!
//! | algorithm | state kept across a change | effect of an upgrade |
//! |---|---|---|
//! | GCRA (cell, funnel, token bucket) | the theoretical arrival time (an instant) | the larger burst applies at once to the same debt; a downgrade waits until the debt fits the smaller burst |
//! | sliding log | the log of admitted instants | the new `max` and window count the same log |
//! | fixed / sliding window, same window length | the window's counts | the new `max` applies to the units already counted |
//! | fixed / sliding window, another length | none: a separate state | starts fresh (numbered windows of another length are other spans of time) |
//! | concurrency | the leases in flight | the new maximum counts the same requests in flight |
//! | another algorithm | none: a separate state | starts fresh |
//!
//! "Separate state" is a separate store key (`prefix:name~f3600000000000:key`,
//! `~` never appearing in a rule name): switching back finds the old state
//! where it was left, still expiring on its own. So a key moved between
//! window lengths may be admitted up to the sum of both limits within one
//! window; keep one window length per rule across tiers to avoid it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::key::RequestHead;
use crate::policy::Policy;
use crate::store::BoxError;

mod cached;

pub use cached::CachedResolver;

/// A boxed future of a resolver.
pub type ResolveFuture = Pin<Box<dyn Future<Output = Result<Option<Policy>, BoxError>> + Send>>;

/// Finds the policy of a key asynchronously (a customer's quota in a
/// database).
///
/// `Ok(None)` means the rule's own policy. An error is logged and the
/// rule's own policy applies: a failing database degrades a customer to the
/// default tier rather than opening or closing the API.
pub trait PolicyResolver: Send + Sync + 'static {
    /// The policy of `key` (the rule's key part, as its extractor wrote it).
    fn resolve(&self, key: &[u8]) -> ResolveFuture;

    /// The policy of `key` if known without waiting (a cache hit); `None`
    /// sends the request to [`PolicyResolver::resolve`]. The default knows
    /// nothing.
    fn resolve_now(&self, key: &[u8]) -> Option<Option<Policy>> {
        let _ = key;
        None
    }
}

/// A [`PolicyResolver`] from an async closure of the key; see [`resolver_fn`].
#[derive(Clone)]
pub struct ResolverFn<F>(F);

/// A [`PolicyResolver`] calling `f` with the key.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{resolve::{resolver_fn, CachedResolver}, Policy};
///
/// let quotas = CachedResolver::new(
///     resolver_fn(|key: Vec<u8>| async move {
///         // SELECT per_minute FROM customers WHERE api_key = $1
///         let per_minute = if key.starts_with(b"acme") { 1000 } else { 60 };
///         Ok(Some(Policy::sliding_window(per_minute, Duration::from_secs(60))?))
///     }),
///     10_000,                    // customers kept
///     Duration::from_secs(60),   // how stale a quota may be
/// );
/// # let _ = quotas;
/// ```
pub fn resolver_fn<F, Fut>(f: F) -> ResolverFn<F>
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Policy>, BoxError>> + Send + 'static,
{
    ResolverFn(f)
}

impl<F, Fut> PolicyResolver for ResolverFn<F>
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<Policy>, BoxError>> + Send + 'static,
{
    fn resolve(&self, key: &[u8]) -> ResolveFuture {
        Box::pin((self.0)(key.to_vec()))
    }
}

impl<R: PolicyResolver> PolicyResolver for Arc<R> {
    fn resolve(&self, key: &[u8]) -> ResolveFuture {
        (**self).resolve(key)
    }

    fn resolve_now(&self, key: &[u8]) -> Option<Option<Policy>> {
        (**self).resolve_now(key)
    }
}

/// A policy chosen from the request, synchronously.
pub(crate) type PolicyFn = Arc<dyn Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync>;

/// Where a rule takes its policy from, besides its own.
#[derive(Clone)]
pub(crate) enum PolicySource {
    Fn(PolicyFn),
    Resolver(Arc<dyn PolicyResolver>),
}
