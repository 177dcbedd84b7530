//! Policies chosen per request: tiers, negotiated quotas.
//!
//! A [`Limit`](crate::Limit) normally applies one policy to every key. With
//! [`Limit::policy_fn`](crate::Limit::policy_fn) (or
//! [`Limit::policy_from_extension`](crate::Limit::policy_from_extension)) it
//! takes the policy from the request, synchronously: a tier an
//! authentication layer put in the extensions. With
//! [`Limit::resolver`](crate::Limit::resolver) it asks a [`PolicyResolver`]
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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::key::RequestHead;
use crate::policy::Policy;
use crate::store::BoxError;

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

/// Caches another resolver's answers: at most `capacity` keys, each for at
/// most `ttl` (a quota changed in the database applies within `ttl`).
///
/// A hit answers in process, without a future; a miss asks the inner
/// resolver, and concurrent misses of one key may each ask it (the answer
/// is the same). Answers of "the default" are cached too; errors are not.
/// When full, the oldest entry goes first, so a flood of new keys costs
/// the database one call per key and never grows the cache.
pub struct CachedResolver<R> {
    inner: Arc<R>,
    cache: Arc<Cache>,
}

impl<R> Clone for CachedResolver<R> {
    fn clone(&self) -> Self {
        CachedResolver {
            inner: self.inner.clone(),
            cache: self.cache.clone(),
        }
    }
}

impl<R> fmt::Debug for CachedResolver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedResolver")
            .field("capacity", &self.cache.capacity)
            .field("ttl", &Duration::from_nanos(self.cache.ttl_ns))
            .finish_non_exhaustive()
    }
}

struct Cache {
    capacity: usize,
    ttl_ns: u64,
    clock: Arc<dyn Clock>,
    entries: Mutex<Entries>,
}

/// A cached answer: the policy (`None`: the rule's own), when it was cached
/// (ns), and its insertion number.
type Cached = (Option<Policy>, u64, u64);

#[derive(Default)]
struct Entries {
    map: HashMap<Box<[u8]>, Cached, foldhash::fast::RandomState>,
    /// Keys by insertion number, oldest first (with stale duplicates, skipped).
    order: VecDeque<(Box<[u8]>, u64)>,
    inserted: u64,
}

impl<R: PolicyResolver> CachedResolver<R> {
    /// Caches `inner`'s answers for up to `capacity` keys, `ttl` each.
    /// A `capacity` of 0 caches nothing.
    pub fn new(inner: R, capacity: usize, ttl: Duration) -> Self {
        Self::with_clock(inner, capacity, ttl, SystemClock::new())
    }

    /// [`CachedResolver::new`] on another clock (tests).
    pub fn with_clock(inner: R, capacity: usize, ttl: Duration, clock: impl Clock) -> Self {
        CachedResolver {
            inner: Arc::new(inner),
            cache: Arc::new(Cache {
                capacity,
                ttl_ns: u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX),
                clock: Arc::new(clock),
                entries: Mutex::default(),
            }),
        }
    }

    /// Forgets `key`'s cached policy (after changing it in the database).
    pub fn invalidate(&self, key: &[u8]) {
        self.cache.lock().map.remove(key);
    }

    /// The keys cached now (expired ones included until evicted).
    pub fn len(&self) -> usize {
        self.cache.lock().map.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Cache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, key: &[u8]) -> Option<Option<Policy>> {
        let now = self.clock.now_ns();
        let entries = self.lock();
        match entries.map.get(key) {
            Some(&(policy, born, _)) if now.saturating_sub(born) < self.ttl_ns => Some(policy),
            _ => None,
        }
    }

    fn put(&self, key: &[u8], policy: Option<Policy>) {
        if self.capacity == 0 {
            return;
        }
        let now = self.clock.now_ns();
        let mut guard = self.lock();
        let entries = &mut *guard;
        let key: Box<[u8]> = key.into();
        entries.inserted += 1;
        let seq = entries.inserted;
        entries.order.push_back((key.clone(), seq));
        entries.map.insert(key, (policy, now, seq));
        // The order holds one item per insertion: evict the oldest live ones
        // (skipping items of keys since re-inserted or removed) until the map
        // fits.
        while entries.map.len() > self.capacity {
            let Some((old, seq)) = entries.order.pop_front() else {
                break;
            };
            if entries.map.get(&old).is_some_and(|e| e.2 == seq) {
                entries.map.remove(&old);
            }
        }
        // Re-inserted keys leave stale items behind: drop them all once they
        // are as many as the live ones (amortised O(1) per insertion).
        if entries.order.len() > 2 * self.capacity {
            let Entries { map, order, .. } = entries;
            order.retain(|(key, seq)| map.get(key).is_some_and(|e| e.2 == *seq));
        }
    }
}

impl<R: PolicyResolver> PolicyResolver for CachedResolver<R> {
    fn resolve(&self, key: &[u8]) -> ResolveFuture {
        let inner = self.inner.resolve(key);
        let cache = self.cache.clone();
        let key = key.to_vec();
        Box::pin(async move {
            let policy = inner.await?;
            cache.put(&key, policy);
            Ok(policy)
        })
    }

    fn resolve_now(&self, key: &[u8]) -> Option<Option<Policy>> {
        self.cache.get(key)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn counting() -> (Arc<AtomicU64>, impl PolicyResolver) {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let resolver = resolver_fn(move |key: Vec<u8>| {
            c.fetch_add(1, Ordering::SeqCst);
            async move {
                if key == b"boom" {
                    return Err("database down".into());
                }
                let n = key.len() as u64;
                Ok((n > 1).then(|| Policy::fixed_window(n, Duration::from_secs(60)).unwrap()))
            }
        });
        (calls, resolver)
    }

    #[test]
    fn hits_answer_in_process_until_the_ttl() {
        let (calls, inner) = counting();
        let clock = ManualClock::new();
        let cached = CachedResolver::with_clock(inner, 10, Duration::from_secs(5), clock.clone());
        assert_eq!(cached.resolve_now(b"abc"), None, "cold");
        let p = block_on(cached.resolve(b"abc")).unwrap();
        assert_eq!(p.unwrap().limit(), 3);
        assert_eq!(cached.resolve_now(b"abc"), Some(p));
        block_on(cached.resolve(b"a")).unwrap();
        assert_eq!(
            cached.resolve_now(b"a"),
            Some(None),
            "the default is cached"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        clock.advance(Duration::from_secs(5));
        assert_eq!(cached.resolve_now(b"abc"), None, "expired");
        assert!(block_on(cached.resolve(b"boom")).is_err());
        assert_eq!(cached.resolve_now(b"boom"), None, "errors are not cached");
        cached.invalidate(b"a");
        assert_eq!(cached.len(), 1);
    }

    #[test]
    fn the_cache_is_bounded_oldest_first() {
        let (_, inner) = counting();
        let cached = CachedResolver::new(inner, 3, Duration::from_secs(60));
        for key in [&b"k1"[..], b"k2", b"k3", b"k4"] {
            block_on(cached.resolve(key)).unwrap();
        }
        assert_eq!(cached.len(), 3);
        assert_eq!(cached.resolve_now(b"k1"), None, "the oldest went");
        assert!(cached.resolve_now(b"k4").is_some());
        // Re-inserting one key over and over keeps the bookkeeping bounded.
        for _ in 0..100 {
            block_on(cached.resolve(b"k4")).unwrap();
        }
        assert!(cached.cache.lock().order.len() <= 6);
        assert_eq!(cached.len(), 3);
    }
}
