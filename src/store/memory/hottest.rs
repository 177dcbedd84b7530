//! The hottest keys of a memory store: which keys took the most checks and
//! the most denials over a recent interval, in bounded memory.
//!
//! Off by default ([`MemoryStoreBuilder::track_hottest_keys`]). Each count
//! is a Space-Saving summary (Metwally, Agrawal and El Abbadi, 2005): at most
//! `capacity` keys are held; a key not held takes the place of the least
//! counted one and inherits its count as its possible error. So a count is
//! never below the key's true count and at most [`KeyActivity::error`]
//! above it, and every key with more than `total / capacity` of the counted
//! events is held. Checks are sampled one in `sample_every` per thread
//! (each counted `sample_every` times), which keeps the store's hot path
//! off the summary's lock most of the time.
//!
//! [`MemoryStoreBuilder::track_hottest_keys`]: super::MemoryStoreBuilder::track_hottest_keys

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// What [`MemoryStore::hottest_keys`](super::MemoryStore::hottest_keys)
/// reports: the keys with the most checks and with the most denials, most
/// first, over the interval that ended last and the one under way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HottestKeys {
    /// How long the counts cover: from the start of the previous interval
    /// (or of tracking, if later) to now.
    pub span: Duration,
    /// Checks counted in all (each sampled check counts `sample_every`).
    pub checks: u64,
    /// Denials counted in all.
    pub denials: u64,
    /// The keys with the most checks, most first.
    pub by_checks: Vec<KeyActivity>,
    /// The keys with the most denials, most first (keys never denied are
    /// not listed).
    pub by_denials: Vec<KeyActivity>,
}

/// One key of [`HottestKeys`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyActivity {
    /// The store key, as the layer or limiter built it
    /// (`prefix:rule:key-part`): the client's identity, so treat it as such.
    pub key: Box<[u8]>,
    /// Counted checks (or denials, in [`HottestKeys::by_denials`]): at least
    /// the true count (with sampling, an estimate of it) and at most
    /// [`error`](Self::error) above it.
    pub count: u64,
    /// How much of `count` the key may have inherited from keys it
    /// replaced in the summary.
    pub error: u64,
}

/// How the store tracks its hottest keys.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tracking {
    pub(super) capacity: usize,
    pub(super) interval_ns: u64,
    pub(super) sample_every: u32,
}

/// One Space-Saving summary: at most `capacity` keys, their counts in one
/// array so the least counted is found by a scan that vectorizes.
#[derive(Default)]
struct Summary {
    /// A key's hash (the summary's own seed) → its index below. Two keys of
    /// one 64-bit hash (odds 2^-64 per pair) would share an entry.
    index: HashMap<u64, usize, foldhash::fast::RandomState>,
    keys: Vec<Vec<u8>>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    total: u64,
}

impl Summary {
    fn add(&mut self, key: &[u8], n: u64, capacity: usize) {
        self.total += n;
        let hash = self.index.hasher().hash_one(key);
        if let Some(&i) = self.index.get(&hash) {
            self.counts[i] += n;
            return;
        }
        if self.keys.len() < capacity {
            self.index.insert(hash, self.keys.len());
            self.keys.push(key.to_vec());
            self.counts.push(n);
            self.errors.push(0);
            return;
        }
        // The least counted key makes room; its count becomes the error.
        let Some((least, &min)) = self.counts.iter().enumerate().min_by_key(|(_, &c)| c) else {
            return;
        };
        let old = self.index.hasher().hash_one(&self.keys[least]);
        self.index.remove(&old);
        self.index.insert(hash, least);
        // The key's buffer is reused: no allocation once keys fit.
        self.keys[least].clear();
        self.keys[least].extend_from_slice(key);
        self.counts[least] = min + n;
        self.errors[least] = min;
    }

    fn is_full(&self, capacity: usize) -> bool {
        self.keys.len() >= capacity
    }

    fn least(&self) -> u64 {
        self.counts.iter().copied().min().unwrap_or(0)
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], u64, u64)> {
        (self.keys.iter().zip(&self.counts).zip(&self.errors)).map(|((k, &c), &e)| (&k[..], c, e))
    }

    fn count_of(&self, key: &[u8]) -> Option<u64> {
        let hash = self.index.hasher().hash_one(key);
        self.index.get(&hash).map(|&i| self.counts[i])
    }
}

/// The summaries of the interval under way and of the one before it.
#[derive(Default)]
struct Intervals {
    started_ns: u64,
    previous_started_ns: Option<u64>,
    checks: [Summary; 2],
    denials: [Summary; 2],
}

pub(super) struct Tracker {
    tracking: Tracking,
    intervals: Mutex<Intervals>,
}

thread_local! {
    /// Checks this thread has seen since it last sampled one.
    static UNSAMPLED: Cell<u32> = const { Cell::new(0) };
}

impl Tracker {
    pub(super) fn new(tracking: Tracking, now_ns: u64) -> Self {
        Tracker {
            tracking,
            intervals: Mutex::new(Intervals {
                started_ns: now_ns,
                ..Default::default()
            }),
        }
    }

    /// Counts one check of `key` (peeks are not checks: the caller skips
    /// them), sampled.
    #[inline]
    pub(super) fn note(&self, key: &[u8], denied: bool, now_ns: u64) {
        let every = self.tracking.sample_every;
        if every > 1 {
            let skip = UNSAMPLED.with(|seen| {
                let n = seen.get() + 1;
                seen.set(if n >= every { 0 } else { n });
                n < every
            });
            if skip {
                return;
            }
        }
        self.add(key, denied, now_ns, u64::from(every));
    }

    #[inline(never)]
    fn add(&self, key: &[u8], denied: bool, now_ns: u64, weight: u64) {
        let mut intervals = self
            .intervals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        intervals.rotate(now_ns, self.tracking.interval_ns);
        let capacity = self.tracking.capacity;
        intervals.checks[0].add(key, weight, capacity);
        if denied {
            intervals.denials[0].add(key, weight, capacity);
        }
    }

    /// The `n` hottest keys by checks and by denials.
    pub(super) fn report(&self, n: usize, now_ns: u64) -> HottestKeys {
        let mut intervals = self
            .intervals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        intervals.rotate(now_ns, self.tracking.interval_ns);
        let since = intervals
            .previous_started_ns
            .unwrap_or(intervals.started_ns);
        HottestKeys {
            span: Duration::from_nanos(now_ns.saturating_sub(since)),
            checks: intervals.checks.iter().map(|s| s.total).sum(),
            denials: intervals.denials.iter().map(|s| s.total).sum(),
            by_checks: top(&intervals.checks, n, self.tracking.capacity),
            by_denials: top(&intervals.denials, n, self.tracking.capacity),
        }
    }
}

impl Intervals {
    /// Starts a new interval when the current one is over; after two
    /// intervals without any check, both summaries are empty.
    fn rotate(&mut self, now_ns: u64, interval_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.started_ns);
        if elapsed < interval_ns {
            return;
        }
        let intervals_passed = elapsed / interval_ns;
        let started = self.started_ns + intervals_passed * interval_ns;
        if intervals_passed == 1 {
            self.checks.swap(0, 1);
            self.denials.swap(0, 1);
            self.previous_started_ns = Some(self.started_ns);
        } else {
            self.checks[1] = Summary::default();
            self.denials[1] = Summary::default();
            self.previous_started_ns = Some(started - interval_ns);
        }
        self.checks[0] = Summary::default();
        self.denials[0] = Summary::default();
        self.started_ns = started;
    }
}

/// The `n` keys of both summaries with the highest summed counts.
fn top(summaries: &[Summary; 2], n: usize, capacity: usize) -> Vec<KeyActivity> {
    let mut merged: HashMap<&[u8], (u64, u64)> = HashMap::new();
    for summary in summaries {
        for (key, count, error) in summary.entries() {
            let entry = merged.entry(key).or_default();
            entry.0 += count;
            entry.1 += error;
        }
    }
    // A key missing from a full summary may have had up to its least
    // count there (a summary never full counted every key exactly): counts
    // stay upper bounds.
    for summary in summaries.iter().filter(|s| s.is_full(capacity)) {
        let floor = summary.least();
        for (key, entry) in merged.iter_mut() {
            if summary.count_of(key).is_none() {
                entry.0 += floor;
                entry.1 += floor;
            }
        }
    }
    let mut keys: Vec<KeyActivity> = merged
        .into_iter()
        .map(|(key, (count, error))| KeyActivity {
            key: key.into(),
            count,
            error,
        })
        .collect();
    keys.sort_unstable_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    keys.truncate(n);
    keys
}
