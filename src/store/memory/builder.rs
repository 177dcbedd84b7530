//! Configuring a [`MemoryStore`], and the janitor thread that sweeps it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use super::hottest::{Tracker, Tracking};
use super::{
    MemoryShared, MemoryStore, Overflow, Shard, Space, DEFAULT_HOTTEST_SAMPLE, DEFAULT_MAX_KEYS,
    DEFAULT_MAX_PENALTY_KEYS, DEFAULT_OVERFLOW_BUCKETS, DEFAULT_SWEEP_INTERVAL,
};
use crate::clock::{Clock, SystemClock};

/// Builds a [`MemoryStore`] with explicit limits and clock.
#[derive(Debug)]
#[must_use = "builders do nothing until used"]
pub struct MemoryStoreBuilder<C> {
    clock: C,
    max_keys: usize,
    max_penalty_keys: usize,
    /// Per-prefix caps, in the order given (a repeated prefix replaces its cap).
    prefix_caps: Vec<(Box<[u8]>, usize)>,
    shards: usize,
    sweep_interval: Option<Duration>,
    /// Capacity and interval of the hottest-keys summaries, when tracked.
    hottest: Option<(usize, u64)>,
    hottest_sample: u32,
    overflow_buckets: usize,
    evict_when_full: bool,
}

impl MemoryStoreBuilder<SystemClock> {
    pub(super) fn new() -> Self {
        MemoryStoreBuilder {
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            max_penalty_keys: DEFAULT_MAX_PENALTY_KEYS,
            prefix_caps: Vec::new(),
            shards: 256,
            sweep_interval: Some(DEFAULT_SWEEP_INTERVAL),
            hottest: None,
            hottest_sample: DEFAULT_HOTTEST_SAMPLE,
            overflow_buckets: DEFAULT_OVERFLOW_BUCKETS,
            evict_when_full: false,
        }
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The clock (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            clock,
            max_keys: self.max_keys,
            max_penalty_keys: self.max_penalty_keys,
            prefix_caps: self.prefix_caps,
            shards: self.shards,
            sweep_interval: self.sweep_interval,
            hottest: self.hottest,
            hottest_sample: self.hottest_sample,
            overflow_buckets: self.overflow_buckets,
            evict_when_full: self.evict_when_full,
        }
    }

    /// Cap on live keys (default [`DEFAULT_MAX_KEYS`]; at least 1) that
    /// match no [`max_keys_for`](Self::max_keys_for) prefix. New keys beyond
    /// it take the room of keys at rest or of the least used live key, or are
    /// decided on shared counters (see [the module](super#when-the-store-is-full)).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Gives the keys that start with `prefix` their own cap (at least 1)
    /// and their own shared counters, apart from [`max_keys`](Self::max_keys)
    /// and from every other prefix: a flood of new keys under one prefix
    /// cannot take the room of another.
    ///
    /// A layer's keys start with its [`prefix`](crate::ThrottleLayer::prefix)
    /// and `:`, so pass `"search:"` for a layer with `.prefix("search")`. A key
    /// counts toward the longest prefix it starts with. Calling this again
    /// with the same prefix replaces its cap; an empty prefix sets
    /// [`max_keys`](Self::max_keys). The store holds at most `max_keys` plus
    /// the sum of these caps (and the room of lock-out state,
    /// [`max_penalty_keys`](Self::max_penalty_keys)).
    ///
    /// ```
    /// use tower_throttle::MemoryStore;
    ///
    /// // Client-chosen keys on the public search route get 100,000 keys;
    /// // everything else keeps the default cap.
    /// let store = MemoryStore::builder().max_keys_for("search:", 100_000).build();
    /// # drop(store);
    /// ```
    pub fn max_keys_for(mut self, prefix: impl AsRef<[u8]>, max_keys: usize) -> Self {
        let prefix = prefix.as_ref();
        let max_keys = max_keys.max(1);
        if prefix.is_empty() {
            self.max_keys = max_keys;
        } else if let Some(cap) = self.prefix_caps.iter_mut().find(|(p, _)| &**p == prefix) {
            cap.1 = max_keys;
        } else {
            self.prefix_caps.push((prefix.into(), max_keys));
        }
        self
    }

    /// Cap on keys of lock-out state (default
    /// [`DEFAULT_MAX_PENALTY_KEYS`]; at least 1): the strikes and locks of
    /// a [`Penalty`](crate::lockout::Penalty) ([`Charge::penalty`]). They
    /// have a room of their own and are never decided on a shared counter,
    /// so a lock announced while the store is full is kept for its whole
    /// duration. Should that room fill too (a flood of denied clients), a
    /// new strike or lock is refused with [`StoreError::Full`] and logged
    /// at error level: the layer then answers per its fail mode.
    ///
    /// [`Charge::penalty`]: crate::store::Charge::penalty
    /// [`StoreError::Full`]: crate::store::StoreError::Full
    pub fn max_penalty_keys(mut self, max_keys: usize) -> Self {
        self.max_penalty_keys = max_keys.max(1);
        self
    }

    /// Number of lock shards, rounded up to a power of two (default 256).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.clamp(1, 1 << 16);
        self
    }

    /// How often the background thread sweeps cold keys; `None` disables it
    /// (shards are still swept as they grow). Default [`DEFAULT_SWEEP_INTERVAL`].
    pub fn sweep_interval(mut self, every: Option<Duration>) -> Self {
        self.sweep_interval = every;
        self
    }

    /// Tracks the hottest keys ([`MemoryStore::hottest_keys`]): the
    /// `capacity` most counted keys by checks and by denials (at least 1;
    /// memory is two summaries of `capacity` keys per interval), counted
    /// over intervals of `interval` (at least 1 ms). Off by default. Checks
    /// are sampled, one in [`sample_hottest_keys`](Self::sample_hottest_keys)
    /// per thread. What it costs each check is measured in BENCHMARKS.md.
    pub fn track_hottest_keys(mut self, capacity: usize, interval: Duration) -> Self {
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        self.hottest = Some((capacity.clamp(1, 1 << 16), interval_ns.max(1_000_000)));
        self
    }

    /// Counts one check in `every` (per thread, at least 1; default
    /// [`DEFAULT_HOTTEST_SAMPLE`]) for the hottest keys, each `every` times:
    /// 1 counts every check exactly. Has an effect only with
    /// [`track_hottest_keys`](Self::track_hottest_keys), called before or after.
    pub fn sample_hottest_keys(mut self, every: u32) -> Self {
        self.hottest_sample = every.max(1);
        self
    }

    /// Whether a full namespace evicts a live key to make room for a new one
    /// (default `false`): the least used of a sample of the shard's keys of
    /// that namespace and policy, and only one with quota left, never lock-out
    /// state or a concurrency key. New clients then always get a state of
    /// their own, at a cost in exactness: a client whose key was evicted
    /// regains the units it had used (fewer than the limit) each time, so a
    /// client cycling through more keys than the cap, each evicted before it
    /// comes back, is not limited at all. Off, the store never admits more
    /// than a limit; a full namespace decides new keys on its shared
    /// counters (see [the module](super#when-the-store-is-full)).
    pub fn evict_when_full(mut self, evict: bool) -> Self {
        self.evict_when_full = evict;
        self
    }

    /// How many shared counters per (namespace, policy) decide the new keys
    /// a full namespace finds no room for (default
    /// [`DEFAULT_OVERFLOW_BUCKETS`]; 1 to 4,096): each new key is decided
    /// on the one its hash picks, so a flood spends the counters its keys
    /// land on, and together new keys get at most this many times the
    /// rule's rate. Each counter holds one state of the rule's policy.
    pub fn overflow_buckets(mut self, buckets: usize) -> Self {
        self.overflow_buckets = buckets.clamp(1, 4096);
        self
    }

    /// Builds the store, starting the janitor thread if enabled.
    pub fn build(self) -> MemoryStore<C> {
        let total = (self.prefix_caps.iter()).fold(self.max_keys, |sum, c| sum.saturating_add(c.1));
        let total = total.saturating_add(self.max_penalty_keys);
        let shards = self.shards.next_power_of_two();
        let shards = shards
            .min(total.checked_next_power_of_two().unwrap_or(usize::MAX))
            .max(1);
        let mut prefix_caps = self.prefix_caps;
        // Longest first: a key counts toward the longest prefix it starts with.
        prefix_caps.sort_by_key(|c| std::cmp::Reverse(c.0.len()));
        // In namespace order: the rest, lock-out state, then the prefixes.
        let spaces = [
            Space::new(Box::default(), self.max_keys),
            Space::new(Box::default(), self.max_penalty_keys),
        ]
        .into_iter()
        .chain(prefix_caps.into_iter().map(|(p, n)| Space::new(p, n)))
        .collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let now_ns = self.clock.now_ns();
        let inner = Arc::new(MemoryShared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            clock: self.clock,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..shards).map(|_| RwLock::new(Shard::new())).collect(),
            shard_bits: shards.trailing_zeros(),
            spaces,
            overflow: Overflow::new(self.overflow_buckets, self.evict_when_full),
            next_permit: AtomicU64::new(1),
            janitor: Mutex::new(None),
            namespaces: Default::default(),
            hottest: self.hottest.map(|(capacity, interval_ns)| {
                let tracking = Tracking {
                    capacity,
                    interval_ns,
                    sample_every: self.hottest_sample,
                };
                Tracker::new(tracking, now_ns)
            }),
        });
        if let Some(every) = self.sweep_interval {
            spawn_janitor(&inner, every);
        }
        MemoryStore { inner }
    }
}

fn spawn_janitor<C: Clock>(inner: &Arc<MemoryShared<C>>, every: Duration) {
    let weak: Weak<MemoryShared<C>> = Arc::downgrade(inner);
    let spawned = std::thread::Builder::new()
        .name("tower-throttle-janitor".into())
        .spawn(move || loop {
            std::thread::park_timeout(every);
            let Some(inner) = weak.upgrade() else { return };
            MemoryStore { inner }.sweep();
        });
    // Without the thread, shards are still swept as they grow.
    if let Ok(handle) = spawned {
        *inner.janitor.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(handle.thread().clone());
    }
}
