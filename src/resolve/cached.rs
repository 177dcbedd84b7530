//! [`CachedResolver`]: a bounded TTL cache in front of a resolver, with one
//! call in flight per key.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::OnceCell;

use super::{PolicyResolver, ResolveFuture};
use crate::clock::{Clock, SystemClock};
use crate::policy::Policy;

/// Caches another resolver's answers: at most `capacity` keys, each for at
/// most `ttl` (a quota changed in the database applies within `ttl`).
///
/// A hit answers in process, without a future. Misses are single-flight:
/// concurrent misses of one key share one call of the inner resolver and
/// its answer (or its error), so a hot key whose entry expired costs the
/// database one query, not one per request. A caller dropped mid-call does
/// not strand the others: the next one waiting takes the call over. Answers
/// of "the default" are cached too; errors are not. When full, the oldest
/// entry goes first, so a flood of new keys costs the database one call per
/// key and never grows the cache.
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
    /// The calls of the inner resolver in flight, by key.
    flights: Mutex<HashMap<Box<[u8]>, Arc<Flight>, foldhash::fast::RandomState>>,
}

/// One call of the inner resolver that every concurrent miss of its key
/// awaits. The error is kept as text: every waiter gets its own copy.
type Flight = OnceCell<Result<Option<Policy>, Arc<str>>>;

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
                flights: Mutex::default(),
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
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn flights(
        &self,
    ) -> MutexGuard<'_, HashMap<Box<[u8]>, Arc<Flight>, foldhash::fast::RandomState>> {
        self.flights.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The flight of `key`, joined or started.
    fn board(self: &Arc<Self>, key: &[u8]) -> Boarded {
        let flight = self.flights().entry(key.into()).or_default().clone();
        Boarded {
            cache: self.clone(),
            key: key.into(),
            flight,
        }
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

/// A caller's seat on a flight. Leaving (answered or dropped), the last
/// caller of a flight, or any caller of a finished one, takes it off the
/// board, so a key's next miss after the TTL makes a fresh call and an
/// abandoned flight holds no memory.
struct Boarded {
    cache: Arc<Cache>,
    key: Box<[u8]>,
    flight: Arc<Flight>,
}

impl Drop for Boarded {
    fn drop(&mut self) {
        let mut flights = self.cache.flights();
        if let Some(on_board) = flights.get(&self.key) {
            // Seats are taken under this lock: the count cannot rise meanwhile.
            let last = Arc::strong_count(&self.flight) == 2;
            if Arc::ptr_eq(on_board, &self.flight) && (last || self.flight.initialized()) {
                flights.remove(&self.key);
            }
        }
    }
}

impl<R: PolicyResolver> PolicyResolver for CachedResolver<R> {
    fn resolve(&self, key: &[u8]) -> ResolveFuture {
        let seat = self.cache.board(key);
        let inner = self.inner.clone();
        Box::pin(async move {
            let answer = seat
                .flight
                .get_or_init(|| async {
                    let answer = inner.resolve(&seat.key).await;
                    match answer {
                        Ok(policy) => {
                            seat.cache.put(&seat.key, policy);
                            Ok(policy)
                        }
                        Err(e) => Err(Arc::from(e.to_string())),
                    }
                })
                .await
                .clone();
            answer.map_err(|e| e.to_string().into())
        })
    }

    fn resolve_now(&self, key: &[u8]) -> Option<Option<Policy>> {
        self.cache.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::resolve::resolver_fn;
    use std::future::Future;
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

    /// A resolver whose calls wait for `gate`, counting them.
    fn gated(gate: Arc<tokio::sync::Notify>) -> (Arc<AtomicU64>, impl PolicyResolver) {
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        let resolver = resolver_fn(move |key: Vec<u8>| {
            c.fetch_add(1, Ordering::SeqCst);
            let gate = gate.clone();
            async move {
                gate.notified().await;
                if key == b"boom" {
                    return Err("database down".into());
                }
                Ok(Some(
                    Policy::fixed_window(7, Duration::from_secs(60)).unwrap(),
                ))
            }
        });
        (calls, resolver)
    }

    #[tokio::test]
    async fn concurrent_misses_of_one_key_share_one_call() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let (calls, inner) = gated(gate.clone());
        let cached = CachedResolver::new(inner, 10, Duration::from_secs(60));
        let waiters: Vec<_> = (0..50)
            .map(|_| tokio::spawn(cached.resolve(b"hot")))
            .chain((0..3).map(|_| tokio::spawn(cached.resolve(b"boom"))))
            .collect();
        tokio::task::yield_now().await;
        while calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        gate.notify_waiters();
        let mut answers = Vec::new();
        for w in waiters {
            answers.push(w.await.unwrap());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one call per key");
        for a in &answers[..50] {
            assert_eq!(a.as_ref().unwrap().unwrap().limit(), 7);
        }
        for a in &answers[50..] {
            assert_eq!(a.as_ref().unwrap_err().to_string(), "database down");
        }
        assert!(cached.cache.flights().is_empty(), "finished flights leave");
        assert_eq!(cached.resolve_now(b"hot").unwrap().unwrap().limit(), 7);
        assert_eq!(cached.resolve_now(b"boom"), None, "errors are not cached");
        // The error was not cached: the next miss asks again.
        let retry = tokio::spawn(cached.resolve(b"boom"));
        while calls.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        gate.notify_waiters();
        assert!(retry.await.unwrap().is_err());
    }

    #[tokio::test]
    async fn a_dropped_caller_hands_the_call_to_the_next() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let (calls, inner) = gated(gate.clone());
        let cached = CachedResolver::new(inner, 10, Duration::from_secs(60));
        let first = tokio::spawn(cached.resolve(b"k"));
        let second = tokio::spawn(cached.resolve(b"k"));
        while calls.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        while calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        gate.notify_waiters();
        assert_eq!(second.await.unwrap().unwrap().unwrap().limit(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(cached.cache.flights().is_empty());
        // Every caller dropped before an answer: nothing is left behind.
        let lone = cached.resolve(b"never");
        assert_eq!(cached.cache.flights().len(), 1);
        drop(lone);
        assert!(cached.cache.flights().is_empty());
    }
}
