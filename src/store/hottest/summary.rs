//! The bounded heavy-hitters summaries behind every hottest-keys report
//! (the memory store's own and the [`Hottest`](super::Hottest) wrapper's):
//! two Space-Saving summaries per interval (checks, denials), the interval
//! under way and the one before it.

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::report::{HottestKeys, KeyActivity};

/// How a tracker counts: the summaries' capacity, the interval and the
/// sampling.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tracking {
    pub(crate) capacity: usize,
    pub(crate) interval_ns: u64,
    pub(crate) sample_every: u32,
}

impl Tracking {
    /// The tracking every constructor accepts: capacity 1 to 65,536, an
    /// interval of at least 1 ms, sampling one check in at least 1.
    pub(crate) fn new(capacity: usize, interval: Duration, sample_every: u32) -> Self {
        let interval_ns = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        Tracking {
            capacity: capacity.clamp(1, 1 << 16),
            interval_ns: interval_ns.max(1_000_000),
            sample_every: sample_every.max(1),
        }
    }
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

/// Counts checks and denials per key, in bounded memory.
pub(crate) struct Tracker {
    tracking: Tracking,
    intervals: Mutex<Intervals>,
}

thread_local! {
    /// Checks this thread has seen since it last sampled one.
    static UNSAMPLED: Cell<u32> = const { Cell::new(0) };
}

impl Tracker {
    pub(crate) fn new(tracking: Tracking, now_ns: u64) -> Self {
        Tracker {
            tracking,
            intervals: Mutex::new(Intervals {
                started_ns: now_ns,
                ..Default::default()
            }),
        }
    }

    pub(crate) fn tracking(&self) -> Tracking {
        self.tracking
    }

    /// Counts one check of `key` (peeks are not checks: the caller skips
    /// them), sampled.
    #[inline]
    pub(crate) fn note(&self, key: &[u8], denied: bool, now_ns: u64) {
        self.note_at(key, denied, || now_ns);
    }

    /// [`note`](Self::note), reading the time only for a check that is
    /// sampled (a caller without a reading at hand spares the others one).
    #[inline]
    pub(crate) fn note_at(&self, key: &[u8], denied: bool, now_ns: impl FnOnce() -> u64) {
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
        self.add(key, denied, now_ns(), u64::from(every));
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
    pub(crate) fn report(&self, n: usize, now_ns: u64) -> HottestKeys {
        let mut intervals = self
            .intervals
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        intervals.rotate(now_ns, self.tracking.interval_ns);
        let since = intervals
            .previous_started_ns
            .unwrap_or(intervals.started_ns);
        let estimated = self.tracking.sample_every > 1;
        HottestKeys {
            span: Duration::from_nanos(now_ns.saturating_sub(since)),
            checks: intervals.checks.iter().map(|s| s.total).sum(),
            denials: intervals.denials.iter().map(|s| s.total).sum(),
            sample_every: self.tracking.sample_every,
            by_checks: top(&intervals.checks, n, self.tracking.capacity, estimated),
            by_denials: top(&intervals.denials, n, self.tracking.capacity, estimated),
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
fn top(summaries: &[Summary; 2], n: usize, capacity: usize, estimated: bool) -> Vec<KeyActivity> {
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
    // stay upper bounds, and count − error stays a lower bound.
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
            lower_bound: count.saturating_sub(error),
            estimated,
        })
        .collect();
    // Most counted first; of equal upper bounds, the surer first.
    keys.sort_unstable_by(|a, b| {
        (b.count.cmp(&a.count))
            .then_with(|| b.lower_bound.cmp(&a.lower_bound))
            .then_with(|| a.key.cmp(&b.key))
    });
    keys.truncate(n);
    keys
}
