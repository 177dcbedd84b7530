//! Configuring a [`MemoryStore`], and the janitor thread that sweeps it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use super::{Inner, MemoryStore, Shard, DEFAULT_MAX_KEYS, DEFAULT_SWEEP_INTERVAL};
use crate::clock::{Clock, SystemClock};

/// Builds a [`MemoryStore`] with explicit limits and clock.
#[derive(Debug)]
pub struct MemoryStoreBuilder<C> {
    clock: C,
    max_keys: usize,
    shards: usize,
    sweep_interval: Option<Duration>,
}

impl MemoryStoreBuilder<SystemClock> {
    pub(super) fn new() -> Self {
        MemoryStoreBuilder {
            clock: SystemClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            shards: 256,
            sweep_interval: Some(DEFAULT_SWEEP_INTERVAL),
        }
    }
}

impl<C: Clock> MemoryStoreBuilder<C> {
    /// The clock (a [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> MemoryStoreBuilder<C2> {
        MemoryStoreBuilder {
            clock,
            max_keys: self.max_keys,
            shards: self.shards,
            sweep_interval: self.sweep_interval,
        }
    }

    /// Cap on live keys (default [`DEFAULT_MAX_KEYS`]); at least one per shard.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
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

    /// Builds the store, starting the janitor thread if enabled.
    pub fn build(self) -> MemoryStore<C> {
        let shards = self.shards.next_power_of_two();
        let shards = shards.min(self.max_keys.next_power_of_two()).max(1);
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let inner = Arc::new(Inner {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            clock: self.clock,
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..shards).map(|_| RwLock::new(Shard::new())).collect(),
            shard_bits: shards.trailing_zeros(),
            max_keys: self.max_keys,
            live: AtomicUsize::new(0),
            next_permit: AtomicU64::new(1),
            janitor: Mutex::new(None),
            namespaces: Default::default(),
        });
        if let Some(every) = self.sweep_interval {
            spawn_janitor(&inner, every);
        }
        MemoryStore { inner }
    }
}

fn spawn_janitor<C: Clock>(inner: &Arc<Inner<C>>, every: Duration) {
    let weak: Weak<Inner<C>> = Arc::downgrade(inner);
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
