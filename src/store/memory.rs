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
//! background janitor thread, so memory returns without a manual call. The
//! number of live keys is capped: when full, new keys get [`StoreError::Full`]
//! (the layer's fail mode decides) rather than evicting live state, which
//! would hand an attacker a fresh quota.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Duration;

use super::{Rule, Store, StoreError};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, Policy};

mod builder;
mod hot;
mod multi;
mod shard;
mod slot;

pub use builder::MemoryStoreBuilder;
use shard::Shard;
use slot::Slot;

/// Default cap on live keys.
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;
/// Default interval of the background sweep.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
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

struct Inner<C> {
    /// Unique per store, so thread caches never confuse two stores.
    id: u64,
    clock: C,
    hasher: foldhash::fast::RandomState,
    shards: Box<[RwLock<Shard>]>,
    shard_bits: u32,
    max_keys: usize,
    /// Keys held across all shards, for the cap.
    live: AtomicUsize,
    next_permit: AtomicU64,
    janitor: Mutex<Option<std::thread::Thread>>,
    namespaces: super::Namespaces,
}

impl<C> Drop for Inner<C> {
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
/// use tower_throttle::{MemoryStore, Policy, Rule};
///
/// let store = MemoryStore::new();
/// let reply = Policy::sliding_log(5, Duration::from_secs(60))?;
/// let d = store.check_sync(Rule::new(b"laoqian:reply", &reply, 1))?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryStore<C: Clock = SystemClock> {
    inner: Arc<Inner<C>>,
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
            .field("max_keys", &self.inner.max_keys)
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

    /// Live keys (including any not yet swept after going cold).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| read(s).slots.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every key that is back to a fresh state; returns how many. The
    /// janitor calls this; call it yourself only to free memory at once.
    pub fn sweep(&self) -> usize {
        let now = self.inner.clock.now_ns();
        self.inner
            .shards
            .iter()
            .map(|s| self.sweep_shard(&mut write(s), now))
            .sum()
    }

    fn sweep_shard(&self, shard: &mut Shard, now: u64) -> usize {
        let freed = shard.sweep(now);
        self.inner.live.fetch_sub(freed, Ordering::Relaxed);
        freed
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

    /// Decides one rule now, synchronously. [`Store::check`] calls this.
    pub fn check_sync(&self, rule: Rule<'_>) -> Result<Decision, StoreError> {
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(rule.key);
        let mut promote = false;
        if let Algorithm::Gcra(p) = rule.policy.algorithm() {
            match hot::check(self.inner.id, hash, p, now, rule.cost) {
                hot::Lookup::Hit(d) => return Ok(d),
                hot::Lookup::Miss { promote: run } => promote = run,
            }
        }
        let shard = self.shard(index);
        let permit = rule.policy.is_concurrency().then(|| self.next_permit());
        let found = read(shard)
            .slots
            .get(&hash)
            .and_then(|slot| slot.check(rule.policy, now, rule.cost, permit));
        if let Some(d) = found {
            // The read lock is released: promoting takes the write lock.
            if promote {
                self.promote(index, hash);
            }
            return Ok(d);
        }
        // Absent, or held for another algorithm: decide on a fresh state and
        // insert only what an admission changes.
        let mut fresh = Slot::fresh(rule.policy);
        let decision = fresh
            .check(rule.policy, now, rule.cost, permit)
            .expect("a fresh slot matches its policy");
        let mut shard = write(shard);
        if let Some(slot) = shard.slots.get(&hash) {
            // Inserted meanwhile by another caller.
            if let Some(d) = slot.check(rule.policy, now, rule.cost, permit) {
                return Ok(d);
            }
        }
        if decision.allowed && rule.cost > 0 {
            if !shard.slots.contains_key(&hash) {
                self.make_room(&mut shard, now, 1)?;
            }
            shard.next_expiry = shard.next_expiry.min(fresh.expires_at());
            // Replacing another algorithm's slot drops (and retires) it.
            shard.slots.insert(hash, fresh);
        }
        Ok(decision)
    }

    /// Gives this thread a hot cell for a GCRA key it keeps checking.
    #[cold]
    fn promote(&self, index: usize, hash: u64) {
        let cell = write(self.shard(index))
            .slots
            .get_mut(&hash)
            .and_then(Slot::promote);
        if let Some(cell) = cell {
            hot::cache(self.inner.id, hash, cell);
        }
    }

    /// Ensures `extra` new keys fit in `shard` and under the global cap,
    /// sweeping cold keys first; counts them as held.
    fn make_room(&self, shard: &mut Shard, now: u64, extra: usize) -> Result<(), StoreError> {
        if shard.slots.len() + extra > shard.sweep_at && now >= shard.next_expiry {
            self.sweep_shard(shard, now);
        }
        let fits = |inner: &Inner<C>| inner.live.load(Ordering::Relaxed) + extra <= inner.max_keys;
        if !fits(&self.inner) {
            if now >= shard.next_expiry {
                self.sweep_shard(shard, now);
            }
            // Other shards may hold cold keys; skip any that is busy (or is
            // the one we hold) rather than wait for it.
            for other in self.inner.shards.iter() {
                if fits(&self.inner) {
                    break;
                }
                if let Ok(mut other) = other.try_write() {
                    if now >= other.next_expiry {
                        self.sweep_shard(&mut other, now);
                    }
                }
            }
            if !fits(&self.inner) {
                return Err(StoreError::Full {
                    max_keys: self.inner.max_keys,
                });
            }
        }
        self.inner.live.fetch_add(extra, Ordering::Relaxed);
        Ok(())
    }

    /// Gives `amount` units back to `key`.
    pub fn refund_sync(&self, key: &[u8], policy: &Policy, amount: u64) {
        self.update(key, policy, |slot, now| slot.refund(policy, now, amount));
    }

    /// Releases a concurrency permit.
    pub fn release_sync(&self, key: &[u8], policy: &Policy, permit: PermitId) {
        self.update(key, policy, |slot, _| slot.release(policy, permit));
    }

    /// Forgets `key`.
    pub fn reset_sync(&self, key: &[u8]) {
        let (hash, index) = self.locate(key);
        if write(self.shard(index)).slots.remove(&hash).is_some() {
            self.inner.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn update(&self, key: &[u8], policy: &Policy, f: impl FnOnce(&mut Slot, u64)) {
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(key);
        let mut shard = write(self.shard(index));
        if let Some(slot) = shard.slots.get_mut(&hash) {
            if slot.matches(policy) {
                f(slot, now);
                let at = slot.expires_at();
                shard.next_expiry = shard.next_expiry.min(at);
            }
        }
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

    async fn check(&self, rule: Rule<'_>) -> Result<Decision, StoreError> {
        self.check_sync(rule)
    }

    async fn check_all(&self, rules: &[Rule<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.check_all_sync(rules)
    }

    async fn refund(&self, key: &[u8], policy: &Policy, amount: u64) -> Result<(), StoreError> {
        self.refund_sync(key, policy, amount);
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

    fn check_all_now(&self, rules: &[Rule<'_>]) -> Option<Result<Vec<Decision>, StoreError>> {
        Some(self.check_all_sync(rules))
    }

    fn check_now(&self, rule: Rule<'_>) -> Option<Result<Decision, StoreError>> {
        Some(self.check_sync(rule))
    }
}
