//! The in-memory store: sharded maps, GCRA state in one atomic word.
//!
//! Keys are stored as a 64-bit keyed hash (random seed per store), not as
//! bytes, so an idle GCRA key costs one map bucket: 24 bytes plus control.
//! The hot path takes a shard's read lock and updates the key's state with a
//! compare-and-swap (GCRA) or a per-key mutex (the others); only new keys take
//! the write lock. A GCRA key that one thread keeps checking is promoted to a
//! cell that thread decides without any lock (see `hot`): one clock read, one
//! hash and one compare-and-swap per check. Multi-rule checks take the write locks of every shard they
//! touch, in index order, which excludes all other writers to those keys.
//!
//! Cold keys (back to a fresh state) are swept as a shard grows and by a
//! background janitor thread, so memory returns without a manual call.
//!
//! # When the store is full
//!
//! The number of live keys is capped ([`MemoryStoreBuilder::max_keys`],
//! default [`DEFAULT_MAX_KEYS`]). A new key that finds its namespace (below)
//! at its cap gets room in this order:
//!
//! 1. **Keys at rest are reclaimed**: keys back to a fresh state are swept,
//!    in the key's shard, then in the others (at most once a second, or as
//!    soon as a key seen there comes to rest).
//! 2. **Only if asked, the least used live key is evicted**
//!    ([`MemoryStoreBuilder::evict_when_full`], off by default): of a sample
//!    of 32 keys of the new key's shard, namespace and policy, the one that
//!    used the fewest units and still has quota left; never lock-out state,
//!    a concurrency key (its permits are held) or a key of the same
//!    multi-rule check. New clients then always get a state of their own,
//!    but a client whose key is evicted regains what it had used (fewer
//!    units than the limit) each time: one cycling through more keys than
//!    the cap is not limited at all. That is why it is off by default.
//! 3. **Else a shared counter decides it**: one of
//!    [`overflow_buckets`](MemoryStoreBuilder::overflow_buckets) (default
//!    [`DEFAULT_OVERFLOW_BUCKETS`]) per rule policy and namespace, with the
//!    policy's own limit, picked by the key's hash (keyed per store, so a
//!    client cannot aim at another's). A flood spends the counters its keys
//!    land on, not every newcomer's: a new client is refused only when its
//!    counter is spent, and together new keys get at most that many times
//!    the rule's rate. Each counter holds one state of the policy (for a
//!    sliding log, up to its limit of timestamps).
//!
//! So, by default:
//!
//! - **Keys already held keep their exact limits**, and no key is ever
//!   admitted beyond its limit: a key's own requests are a part of what its
//!   shared counter counts.
//! - **New keys are decided, not refused and not waved through**, and a
//!   flood of distinct keys does not lock out new clients until it spends
//!   most shared counters (about 1,024 × the limit of requests in a window
//!   beyond the cap): measured in BENCHMARKS.md (*A flood of new keys*).
//! - A multi-rule check stays all or nothing, whichever rules land on their
//!   own keys and whichever on shared counters; rules of one check that land
//!   on one shared counter are charged together. Concurrency permits taken
//!   on a shared counter are released by [`Store::release`] as usual.
//!   A refund of a check decided on a shared counter is not returned (it errs on the
//!   strict side), and [`Store::reset`] does not touch shared counters.
//! - A peek (cost 0) of a new key reports a fresh state.
//! - [`MemoryStore::evicted_keys`] and [`MemoryStore::overflowed_checks`]
//!   count evictions and checks decided on shared counters, and
//!   [`MemoryStore::is_full`] tells whether some namespace is at its cap; the
//!   first overflow (and eviction) logs a `tracing` warning (target
//!   `tower_throttle`), then at most one a minute per namespace, naming
//!   counts and the configured prefix, never a key.
//!
//! Shared counters count toward no cap and are swept like keys. At most
//! 1,024 distinct (namespace, policy) pairs have shared counters at once;
//! only a program that builds a new policy per request can reach that, and
//! then (alone) [`StoreError::Full`] is returned. The memory store returns
//! it in no other case.
//!
//! ## Per-prefix caps
//!
//! [`MemoryStoreBuilder::max_keys_for`] gives keys starting with a prefix
//! (a layer's [`prefix`](crate::ThrottleLayer::prefix), or
//! [`Limiter::with_prefix`](crate::Limiter::with_prefix), followed by its
//! `:`) their own cap and their own shared counters. A key counts toward the
//! longest configured prefix it starts with, or toward
//! [`max_keys`](MemoryStoreBuilder::max_keys) if none: flooding one route
//! then leaves the room of every other route untouched. The caps add up:
//! the store holds at most `max_keys` plus the sum of the per-prefix caps,
//! plus the room of lock-out state
//! ([`max_penalty_keys`](MemoryStoreBuilder::max_penalty_keys)), which never
//! overflows: a lock announced is kept.
//! The prefix is matched only when a key is inserted or decided in
//! overflow, never on the path of a key already held, and a store without
//! per-prefix caps matches nothing.
//!
//! ## What an attacker can make the store hold
//!
//! Keys × bytes per key, for each cap. An idle GCRA key costs about 52 bytes
//! (map bucket, control byte and load-factor slack; measured at one million
//! keys by `cargo bench --bench footprint`); the other policies add a boxed
//! state, and a sliding log or a concurrency key one entry per admission
//! still in its window, so a key with a large limit is larger. One
//! client choosing its own keys (a `HeaderKey`, or a `BearerToken` route
//! with no authentication in front) filled the default cap of 4,194,304
//! keys in about 100 s and held 474 MB with its mix of policies. Size the
//! caps for the memory you can spare (at 52 bytes a key, 1,000,000 keys is
//! about 50 MB), give client-keyed routes their own, smaller
//! [`max_keys_for`](MemoryStoreBuilder::max_keys_for), and put
//! authentication in front of routes keyed by credentials.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Duration;

use std::future::Future;

use super::{Answer, Charge, Decisions, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::Policy;

mod admit;
mod builder;
mod hot;
mod hottest;
mod locked;
mod multi;
mod one_rule;
mod overflow;
mod shard;
mod slot;

pub use builder::MemoryStoreBuilder;
pub use hottest::{HottestKeys, KeyActivity};
use overflow::{Overflow, Space};
use shard::Shard;
use slot::{Ns, Slot};

/// Default cap on live keys.
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;

/// Default cap on keys of lock-out state (strikes and locks), apart from
/// [`DEFAULT_MAX_KEYS`]: see [`MemoryStoreBuilder::max_penalty_keys`].
pub const DEFAULT_MAX_PENALTY_KEYS: usize = 1 << 16;
/// Default [`MemoryStoreBuilder::overflow_buckets`].
pub const DEFAULT_OVERFLOW_BUCKETS: usize = 1024;
/// Default interval of the background sweep.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// Default sampling of the hottest keys: one check in 16 per thread
/// ([`MemoryStoreBuilder::sample_hottest_keys`]).
pub const DEFAULT_HOTTEST_SAMPLE: u32 = 16;
const MIN_SWEEP_AT: usize = 64;

/// The keys are already uniform 64-bit hashes: use them as they are.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Slots = HashMap<u64, Slot, BuildHasherDefault<IdentityHasher>>;

struct MemoryShared<C> {
    /// Unique per store, so thread caches never confuse two stores.
    id: u64,
    clock: C,
    hasher: foldhash::fast::RandomState,
    shards: Box<[RwLock<Shard>]>,
    shard_bits: u32,
    /// The namespaces and their caps: the rest first, then the configured
    /// prefixes, longest first.
    spaces: Box<[Space]>,
    overflow: Overflow,
    next_permit: AtomicU64,
    janitor: Mutex<Option<std::thread::Thread>>,
    namespaces: super::Namespaces,
    /// The hottest keys, when tracked.
    hottest: Option<hottest::Tracker>,
}

impl<C> Drop for MemoryShared<C> {
    fn drop(&mut self) {
        if let Some(t) = self
            .janitor
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            t.unpark();
        }
    }
}

/// The default store: in process, concurrent, bounded, self-cleaning.
///
/// Clones share state.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::store::Charge;
/// use tower_throttle::{MemoryStore, Policy};
///
/// let store = MemoryStore::new();
/// let reply = Policy::sliding_log(5, Duration::from_secs(60))?;
/// let d = store.check_sync(Charge::new(b"user-42:reply", &reply, 1))?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryStore<C: Clock = SystemClock> {
    inner: Arc<MemoryShared<C>>,
}

impl<C: Clock> Clone for MemoryStore<C> {
    fn clone(&self) -> Self {
        MemoryStore {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for MemoryStore<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("shards", &self.inner.shards.len())
            .field("max_keys", &self.inner.spaces[0].max_keys)
            .field(
                "prefix_caps",
                &(self.inner.spaces.len() - overflow::FIRST_PREFIX_NS),
            )
            .field("len", &self.len())
            .finish()
    }
}

impl MemoryStore<SystemClock> {
    /// A store with the default limits and the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder<SystemClock> {
        MemoryStoreBuilder::new()
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// The store's clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// Live keys (including any not yet swept after going cold; not counting
    /// shared counters).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| read(s).slots.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keys with the most checks and the most denials (`n` of each,
    /// most first) over the last whole interval and the one under way, when
    /// the store tracks them ([`MemoryStoreBuilder::track_hottest_keys`]);
    /// `None` otherwise. Peeks (cost 0) and lock-out state are not counted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::store::Charge;
    /// use tower_throttle::{MemoryStore, Policy};
    ///
    /// let store = MemoryStore::builder()
    ///     .track_hottest_keys(64, Duration::from_secs(60))
    ///     .sample_hottest_keys(1)
    ///     .build();
    /// let reply = Policy::fixed_window(2, Duration::from_secs(60))?;
    /// for _ in 0..3 {
    ///     store.check_sync(Charge::new(b"reply:user-7", &reply, 1))?;
    /// }
    /// store.check_sync(Charge::new(b"reply:user-8", &reply, 1))?;
    ///
    /// let hottest = store.hottest_keys(10).expect("tracked");
    /// assert_eq!(&*hottest.by_checks[0].key, b"reply:user-7");
    /// assert_eq!(hottest.by_checks[0].count, 3);
    /// assert_eq!(hottest.by_denials.len(), 1); // user-7's third reply
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hottest_keys(&self, n: usize) -> Option<HottestKeys> {
        let tracker = self.inner.hottest.as_ref()?;
        Some(tracker.report(n, self.inner.clock.now_ns()))
    }

    /// Counts a check for [`hottest_keys`](Self::hottest_keys).
    #[inline]
    fn note_hottest(&self, rule: &Charge<'_>, denied: bool, now: u64) {
        if let Some(tracker) = &self.inner.hottest {
            if rule.cost > 0 && !rule.penalty {
                tracker.note(rule.key, denied, now);
            }
        }
    }

    /// The key's hash and its shard's index.
    #[inline]
    fn locate(&self, key: &[u8]) -> (u64, usize) {
        let hash = self.inner.hasher.hash_one(key);
        // Bits 32.. pick the shard: the map itself uses the low bits for the
        // bucket and the top 7 as the probe tag, and both must still vary
        // among the keys of one shard.
        let index = ((hash >> 32) & ((1 << self.inner.shard_bits) - 1)) as usize;
        (hash, index)
    }

    #[inline]
    fn shard(&self, index: usize) -> &RwLock<Shard> {
        &self.inner.shards[index]
    }

    fn next_permit(&self) -> PermitId {
        PermitId(self.inner.next_permit.fetch_add(1, Ordering::Relaxed))
    }
}

fn read(lock: &RwLock<Shard>) -> std::sync::RwLockReadGuard<'_, Shard> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(lock: &RwLock<Shard>) -> RwLockWriteGuard<'_, Shard> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl<C: Clock> Store for MemoryStore<C> {
    fn namespaces(&self) -> Option<&super::Namespaces> {
        Some(&self.inner.namespaces)
    }

    #[inline]
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        // Each arm builds the answer where it returns (see `admit`).
        match charges {
            [charge] if !charge.figures => self.admit_sync(*charge),
            [charge] => Answer::Now(self.check_sync(*charge).map(Decisions::one)),
            _ => Answer::Now(self.check_all_sync(charges).map(Decisions::from)),
        }
    }

    /// [`check_sync`](Self::check_sync): the decision as the algorithm
    /// made it, with no [`Decisions`] around it.
    async fn check(&self, charge: Charge<'_>) -> Result<Decision, StoreError> {
        self.check_sync(charge)
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        self.refund_sync(key, policy, receipt);
        Ok(())
    }

    async fn reset(&self, key: &[u8], _policy: &Policy) -> Result<(), StoreError> {
        self.reset_sync(key);
        Ok(())
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.release_sync(key, policy, permit);
        Ok(())
    }
}
