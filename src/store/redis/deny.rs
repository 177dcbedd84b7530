//! The local denial cache: a denied hot key is answered in process, without
//! a round trip, for as long as Redis would deny it too.
//!
//! Only single-rule checks of the algorithms whose decision is rendered from
//! an O(1) state (GCRA, fixed window, sliding window) are cached. A denial
//! changes no state, and these states only become more permissive as time
//! passes; so the cache keeps the state Redis sent with the denial, and
//! answers a later check of the same key by running the same pure function
//! ([`crate::algorithm`]) on it at an *upper bound* of the server's current
//! time. If that says "denied", Redis would deny too (the state in Redis can
//! only be stricter: other admissions add to it); if it says "allowed", the
//! entry is dropped and the check goes to Redis. So the cache never admits
//! anything, and never denies what Redis would admit unless the state was
//! relaxed behind this store's back (another instance's `refund`, `reset` or
//! a key deleted by hand): this store's own [`refund`](crate::Store::refund),
//! [`reset`](crate::Store::reset) and [`release`](crate::Store::release)
//! drop the entry, and an epoch keeps a reply that raced them from putting it
//! back.
//!
//! Server time is estimated from the reply: the script ran after the caller
//! started the check, so `server_now + (t − t_start)` on the local monotonic
//! clock is never earlier than the server's clock at local time `t`. With a
//! [`TimeSource::Client`](super::TimeSource::Client) clock the cache uses that
//! clock, exactly as the scripts would.
//!
//! Sliding-log and concurrency checks are never cached: their decisions need
//! the whole log, and a concurrency denial lifts as soon as any holder
//! releases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::reply::RawState;
use super::TimeSource;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::policy::Policy;

struct DeniedKey {
    state: RawState,
    /// Server time (ns) minus local time (ns) at the start of the check
    /// that brought the state: adding it to local time over-estimates the
    /// server's clock.
    offset: i128,
    /// Local time after which the denial is certainly over (eviction only).
    until: u64,
}

struct DenyMap {
    map: HashMap<Vec<u8>, DeniedKey, foldhash::fast::RandomState>,
    last_sweep: u64,
}

/// The cache of one store (shared by its clones).
pub(crate) struct DenyCache {
    capacity: usize,
    len: AtomicUsize,
    /// Bumped (under the lock) by every invalidation.
    epoch: AtomicU64,
    inner: Mutex<DenyMap>,
    clock: Option<Arc<dyn Clock>>,
    base: Instant,
}

/// What a check must remember to offer its reply to the cache.
#[derive(Clone, Copy)]
pub(crate) struct Ticket {
    start: u64,
    epoch: u64,
}

const SWEEP_EVERY_NS: u64 = 100_000_000;

impl DenyCache {
    /// A cache of at most `capacity` keys (0: disabled).
    pub(crate) fn new(capacity: usize, time: &TimeSource) -> DenyCache {
        DenyCache {
            capacity,
            len: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            inner: Mutex::new(DenyMap {
                map: HashMap::default(),
                last_sweep: 0,
            }),
            clock: match time {
                TimeSource::Server => None,
                TimeSource::Client(c) => Some(c.clone()),
            },
            base: Instant::now(),
        }
    }

    /// Whether caching is on.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Local time in ns: the client clock truncated to µs as the scripts
    /// see it, else monotonic time since the cache was made.
    fn local_ns(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now_ns() / 1000 * 1000,
            None => u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DenyMap> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Taken before a check is sent.
    pub(crate) fn ticket(&self) -> Ticket {
        Ticket {
            start: self.local_ns(),
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    /// Whether a check of `cost` units may be answered here: the cache
    /// holds some key, and the check charges something (a peek is never
    /// answered from the cache).
    #[inline]
    pub(crate) fn may_answer(&self, cost: u64) -> bool {
        cost > 0 && self.len.load(Ordering::Relaxed) > 0
    }

    /// The denial Redis would give `cost` units of `policy` on `key` now, if
    /// the cached state says so.
    pub(crate) fn lookup(&self, key: &[u8], policy: &Policy, cost: u64) -> Option<Decision> {
        if !self.may_answer(cost) {
            return None;
        }
        let mut inner = self.lock();
        let entry = inner.map.get(key)?;
        let now = self.local_ns();
        let server_now = u64::try_from((i128::from(now) + entry.offset).max(0)).unwrap_or(u64::MAX);
        match entry.state.decide(policy, server_now, cost) {
            Some(d) if !d.allowed => Some(d),
            _ => {
                inner.map.remove(key);
                self.len.store(inner.map.len(), Ordering::Relaxed);
                None
            }
        }
    }

    /// Offers a single-rule check's reply: a denial of a cacheable state is
    /// kept, an admission drops what was kept for the key.
    pub(crate) fn offer(
        &self,
        ticket: Ticket,
        key: &[u8],
        cost: u64,
        decision: &Decision,
        state: Option<RawState>,
        server_now_ns: u64,
    ) {
        if decision.allowed {
            if self.len.load(Ordering::Relaxed) > 0 {
                let mut inner = self.lock();
                inner.map.remove(key);
                self.len.store(inner.map.len(), Ordering::Relaxed);
            }
            return;
        }
        let (Some(state), Some(retry)) = (state, decision.retry_after) else {
            return;
        };
        if cost == 0 {
            return;
        }
        let mut inner = self.lock();
        if self.epoch.load(Ordering::Acquire) != ticket.epoch {
            return; // a refund, reset or release raced this check
        }
        let retry = u64::try_from(retry.as_nanos()).unwrap_or(u64::MAX);
        let entry = DeniedKey {
            state,
            offset: i128::from(server_now_ns) - i128::from(ticket.start),
            until: ticket.start.saturating_add(retry),
        };
        if inner.map.len() >= self.capacity && !inner.map.contains_key(key) {
            let now = self.local_ns();
            if now.saturating_sub(inner.last_sweep) >= SWEEP_EVERY_NS {
                inner.last_sweep = now;
                inner.map.retain(|_, e| e.until > now);
            }
            if inner.map.len() >= self.capacity {
                // Still full of live denials: make room for the newest.
                if let Some(k) = inner.map.keys().next().cloned() {
                    inner.map.remove(&k);
                }
            }
        }
        inner.map.insert(key.to_vec(), entry);
        self.len.store(inner.map.len(), Ordering::Relaxed);
    }

    /// Drops `key`'s entry, and keeps replies already in flight from
    /// putting one back.
    pub(crate) fn invalidate(&self, key: &[u8]) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        inner.map.remove(key);
        self.len.store(inner.map.len(), Ordering::Relaxed);
    }

    /// Keys held (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for DenyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenyCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}
