//! What a full store does: per-prefix caps (namespaces), room for new keys,
//! and the shared counters that decide new keys once their namespace is at
//! its cap. The design and its bounds are documented on the parent module.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::slot::{Ns, Slot};
use super::{MemoryStore, Shard};
use crate::clock::Clock;
use crate::decision::{Decision, PermitId};
use crate::policy::Policy;
use crate::store::{Charge, StoreError};

/// Distinct (namespace, policy) shared counters held at once. Policies come
/// from configuration, so real applications hold a handful; the bound only
/// keeps a program that builds a new policy per request from growing this
/// map without limit.
pub(super) const MAX_OVERFLOW_POLICIES: usize = 1024;
/// Keys of a full shard looked at for one to evict (see `evict`).
const EVICTION_SAMPLE: usize = 32;
/// Evictions start their sample at most this far into a shard's map: the
/// walk to it is paid under the shard's write lock.
const EVICTION_REACH: usize = 1024;
/// At most one warning per namespace this often.
const WARN_EVERY_NS: u64 = 60_000_000_000;
/// A full namespace rescans the other shards for cold keys at most this
/// often (sooner when a key it saw expires sooner): a flood of new keys
/// must not lock every shard once per request.
const RESCAN_NS: u64 = 1_000_000_000;

/// The namespace of lock-out state ([`Charge::penalty`]): never overflows.
pub(super) const PENALTY_NS: Ns = 1;
/// The first namespace of a configured prefix.
pub(super) const FIRST_PREFIX_NS: usize = 2;

/// One namespace: the rest (index 0), lock-out state ([`PENALTY_NS`]), or
/// the keys under a configured prefix.
pub(super) struct Space {
    pub(super) prefix: Box<[u8]>,
    pub(super) max_keys: usize,
    /// Keys held, for the cap.
    pub(super) live: AtomicUsize,
    /// Checks decided on this namespace's shared counters.
    pub(super) overflowed: AtomicU64,
    /// When the last warning was logged (0: never).
    warned_at: AtomicU64,
    /// When the last eviction warning was logged (0: never).
    evict_warned_at: AtomicU64,
}

impl Space {
    pub(super) fn new(prefix: Box<[u8]>, max_keys: usize) -> Self {
        Space {
            prefix,
            max_keys,
            live: AtomicUsize::new(0),
            overflowed: AtomicU64::new(0),
            warned_at: AtomicU64::new(0),
            evict_warned_at: AtomicU64::new(0),
        }
    }

    fn fits(&self) -> bool {
        self.live.load(Ordering::Relaxed) < self.max_keys
    }

    /// Counts one more key if it fits: racing shards never overshoot the cap.
    fn take(&self) -> bool {
        let more = |n: usize| (n < self.max_keys).then_some(n + 1);
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, more)
            .is_ok()
    }
}

/// A shared counter: its namespace, its bucket, and the policy it counts.
type StateKey = (Ns, u32, Policy);
type States = HashMap<StateKey, Slot>;

/// The shared counters, apart from the shards: they count toward no cap.
pub(super) struct Overflow {
    /// Shared counters per (namespace, policy).
    buckets: u32,
    /// Whether a full namespace evicts a live key first.
    evict: bool,
    states: RwLock<States>,
    /// Set once a state exists: until then releases skip the lock.
    used: AtomicBool,
    /// No shard's key expires before this, as of the last full scan.
    scan_after: AtomicU64,
    /// Live keys evicted to make room.
    evicted: AtomicU64,
}

impl Overflow {
    pub(super) fn new(buckets: usize, evict: bool) -> Self {
        Overflow {
            buckets: u32::try_from(buckets).unwrap_or(u32::MAX).max(1),
            evict,
            states: RwLock::default(),
            used: AtomicBool::new(false),
            scan_after: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// The shared counter a key's hash picks.
    pub(super) fn bucket_of(&self, hash: u64) -> u32 {
        // The low bits: the shard index uses bits 32 and up.
        (hash % u64::from(self.buckets)) as u32
    }
}

/// The shared counters, locked for a multi-rule check.
pub(super) type StatesGuard<'a> = RwLockWriteGuard<'a, States>;

impl<C: Clock> MemoryStore<C> {
    /// Checks decided on a shared counter since the store was built: the
    /// checks of new keys that arrived while their namespace was at its cap.
    pub fn overflowed_checks(&self) -> u64 {
        let spaces = self.inner.spaces.iter();
        spaces.map(|s| s.overflowed.load(Ordering::Relaxed)).sum()
    }

    /// Live keys evicted to make room for new ones since the store was
    /// built (see [the module](super#when-the-store-is-full)).
    pub fn evicted_keys(&self) -> u64 {
        self.inner.overflow.evicted.load(Ordering::Relaxed)
    }

    /// True when some namespace holds as many keys as its cap allows, so its
    /// new keys are decided on shared counters (until keys go cold).
    pub fn is_full(&self) -> bool {
        self.inner.spaces.iter().any(|s| !s.fits())
    }

    /// The namespace of `key`: the longest configured prefix it starts with.
    #[inline]
    pub(super) fn namespace(&self, key: &[u8]) -> Ns {
        let spaces = &self.inner.spaces;
        if spaces.len() == FIRST_PREFIX_NS {
            return 0;
        }
        // Sorted longest first by the builder.
        let found = spaces[FIRST_PREFIX_NS..]
            .iter()
            .position(|s| key.starts_with(&s.prefix));
        found.map_or(0, |i| Ns::try_from(i + FIRST_PREFIX_NS).unwrap_or(0))
    }

    /// The namespace a new key of `rule` counts toward: lock-out state in
    /// its own room, everything else by prefix.
    #[inline]
    pub(super) fn space_of(&self, rule: &Charge<'_>) -> Ns {
        if rule.penalty {
            PENALTY_NS
        } else {
            self.namespace(rule.key)
        }
    }

    /// The answer to lock-out state that finds no room: never decided on an
    /// shared counter (a lock there would be announced and not kept).
    #[cold]
    pub(super) fn penalty_room_full(&self) -> StoreError {
        let space = &self.inner.spaces[PENALTY_NS as usize];
        tracing::error!(
            target: "tower_throttle",
            max_penalty_keys = space.max_keys,
            "rate-limit memory store: no room left for lock-out state (strikes, locks); raise max_penalty_keys"
        );
        StoreError::Full {
            max_keys: space.max_keys,
        }
    }

    /// Takes a key of namespace `ns`'s cap for a new key of `policy` in
    /// `shard`: sweeping keys at rest first (in this shard, then the
    /// others), then evicting the least used key of a sample of this shard
    /// (see [`evict`](Self::evict)); false when the namespace is full and
    /// no key may go. `keep` are keys that must stay (a multi-rule check's).
    pub(super) fn make_room(
        &self,
        shard: &mut Shard,
        now: u64,
        ns: Ns,
        policy: &Policy,
        keep: &[u64],
    ) -> bool {
        let space = &self.inner.spaces[ns as usize];
        if shard.slots.len() >= shard.sweep_at && now >= shard.next_expiry {
            self.sweep_shard(shard, now);
        }
        if space.take() {
            return true;
        }
        if now >= shard.next_expiry {
            self.sweep_shard(shard, now);
            if space.take() {
                return true;
            }
        }
        let scan_after = &self.inner.overflow.scan_after;
        if now >= scan_after.load(Ordering::Relaxed) {
            // Other shards may hold cold keys; skip any that is busy (or is
            // one we hold) rather than wait for it.
            let mut soonest = shard.next_expiry.min(now.saturating_add(RESCAN_NS));
            for other in self.inner.shards.iter() {
                if space.fits() {
                    break;
                }
                if let Ok(mut other) = other.try_write() {
                    if now >= other.next_expiry {
                        self.sweep_shard(&mut other, now);
                    }
                    soonest = soonest.min(other.next_expiry);
                }
            }
            if space.take() {
                return true;
            }
            scan_after.store(soonest.max(now.saturating_add(1)), Ordering::Relaxed);
        }
        self.evict(shard, now, ns, policy, keep) && space.take()
    }

    /// Evicts, from a sample of `shard`, the key of namespace `ns` under
    /// `policy` with the most quota left, if it has any left: the least a
    /// client gains from finding its key fresh again (at most the units it
    /// used, fewer than the limit). Never a key with nothing left (a spammer
    /// at its limit stays limited), lock-out state, or a concurrency key
    /// (its permits are held).
    fn evict(&self, shard: &mut Shard, now: u64, ns: Ns, policy: &Policy, keep: &[u64]) -> bool {
        if !self.inner.overflow.evict
            || ns == PENALTY_NS
            || policy.is_concurrency()
            || shard.slots.is_empty()
        {
            return false;
        }
        let len = shard.slots.len();
        let start = shard.evict_at % len.min(EVICTION_REACH);
        shard.evict_at = start + EVICTION_SAMPLE;
        // From `start` round to the map's beginning: a full sample whatever
        // the start.
        let around = shard
            .slots
            .iter()
            .skip(start)
            .chain(shard.slots.iter().take(start));
        let candidates = around
            .filter(|(hash, slot)| slot.ns() == ns && !keep.contains(hash))
            .take(EVICTION_SAMPLE)
            .filter_map(|(&hash, slot)| Some((hash, slot.peek_as(policy, now, 0, None)?)));
        // The fewest units used (not the most left: a counter whose limit is
        // far above what its caller enforces, as an RLS fixed window's,
        // still tells a spent client from a new one), and only a key with
        // quota left.
        let best = candidates
            .filter(|(_, d)| d.remaining > 0)
            .min_by_key(|(_, d)| (d.limit - d.remaining, d.reset_after));
        let Some((hash, _)) = best else {
            return false;
        };
        if let Some(mut slot) = shard.slots.remove(&hash) {
            // A hot cell is retired, so no thread cache decides on it again.
            slot.demote();
            let space = &self.inner.spaces[ns as usize];
            space.live.fetch_sub(1, Ordering::Relaxed);
            let evicted = self.inner.overflow.evicted.fetch_add(1, Ordering::Relaxed) + 1;
            if due(&space.evict_warned_at, now) {
                tracing::warn!(
                    target: "tower_throttle",
                    prefix = %String::from_utf8_lossy(&space.prefix),
                    max_keys = space.max_keys,
                    evicted,
                    "rate-limit memory store is full: evicting the least used keys for new ones"
                );
            }
        }
        true
    }

    /// Decides `rule`, whose key is new while namespace `ns` is full, on the
    /// namespace's shared counter for the rule's policy.
    pub(super) fn check_overflow(
        &self,
        ns: Ns,
        bucket: u32,
        rule: Charge<'_>,
        now: u64,
        permit: Option<PermitId>,
    ) -> Result<Decision, StoreError> {
        self.note_overflow(ns, now);
        let states = &self.inner.overflow.states;
        let key = (ns, bucket, *rule.policy);
        let found = read(states)
            .get(&key)
            .and_then(|s| s.check(rule.policy, now, rule.cost, permit));
        if let Some(d) = found {
            return Ok(d);
        }
        let mut states = write(states);
        let slot = self.overflow_slot(&mut states, ns, bucket, rule.policy, now)?;
        Ok(slot
            .check(rule.policy, now, rule.cost, permit)
            .expect("a shared counter matches its policy"))
    }

    /// The shared counters, for a multi-rule check that holds its shards.
    pub(super) fn overflow_states(&self) -> StatesGuard<'_> {
        write(&self.inner.overflow.states)
    }

    /// The shared counter of (`ns`, `bucket`, `policy`), created if absent.
    /// Errs only when [`MAX_OVERFLOW_POLICIES`] distinct (namespace, policy) pairs' states are live.
    pub(super) fn overflow_slot<'s>(
        &self,
        states: &'s mut States,
        ns: Ns,
        bucket: u32,
        policy: &Policy,
        now: u64,
    ) -> Result<&'s mut Slot, StoreError> {
        let key = (ns, bucket, *policy);
        if !states.contains_key(&key) {
            let max = MAX_OVERFLOW_POLICIES.saturating_mul(self.inner.overflow.buckets as usize);
            if states.len() >= max {
                states.retain(|_, s| !s.retire_if_cold(now));
            }
            if states.len() >= max {
                return Err(StoreError::Full {
                    max_keys: self.inner.spaces[ns as usize].max_keys,
                });
            }
            self.inner.overflow.used.store(true, Ordering::Relaxed);
        }
        Ok(states.entry(key).or_insert_with(|| Slot::fresh(policy, ns)))
    }

    /// Counts a check decided in overflow; warns the first time and then at
    /// most once a minute per namespace. Names counts and the configured
    /// prefix, never a key.
    pub(super) fn note_overflow(&self, ns: Ns, now: u64) {
        let space = &self.inner.spaces[ns as usize];
        let overflowed = space.overflowed.fetch_add(1, Ordering::Relaxed) + 1;
        if due(&space.warned_at, now) {
            tracing::warn!(
                target: "tower_throttle",
                prefix = %String::from_utf8_lossy(&space.prefix),
                live = space.live.load(Ordering::Relaxed),
                max_keys = space.max_keys,
                overflowed,
                "rate-limit memory store is full: new keys share counters (by key hash, per rule) until keys go cold"
            );
        }
    }

    /// Drops shared counters back at a fresh state.
    pub(super) fn sweep_overflow(&self, now: u64) {
        if self.inner.overflow.used.load(Ordering::Relaxed) {
            write(&self.inner.overflow.states).retain(|_, s| !s.retire_if_cold(now));
        }
    }

    /// Releases `permit` if a shared counter holds it. Permit ids are unique
    /// per store, so trying here as well as on the key's own state is safe.
    pub(super) fn release_overflow(&self, key: &[u8], policy: &Policy, permit: PermitId) {
        if !self.inner.overflow.used.load(Ordering::Relaxed) || !policy.is_concurrency() {
            return;
        }
        let ns = self.namespace(key);
        let bucket = self.inner.overflow.bucket_of(self.locate(key).0);
        if let Some(slot) = write(&self.inner.overflow.states).get_mut(&(ns, bucket, *policy)) {
            slot.release(policy, permit);
        }
    }
}

/// Whether a warning last logged at `warned_at` is due again at `now`
/// (the first time, then once a minute); claims it if so.
fn due(warned_at: &AtomicU64, now: u64) -> bool {
    let last = warned_at.load(Ordering::Relaxed);
    let due = last == 0 || now >= last.saturating_add(WARN_EVERY_NS);
    due && (warned_at.compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed))
        .is_ok()
}

fn read(lock: &RwLock<States>) -> RwLockReadGuard<'_, States> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(lock: &RwLock<States>) -> RwLockWriteGuard<'_, States> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
