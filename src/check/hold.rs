//! How long admitted requests hold their concurrency permits, and the
//! wake-up of requests waiting for one.
//!
//! A store's retry for a concurrency denial is the time until enough leases
//! lapse: the lease ceiling, an upper bound that is far from what a client
//! should wait when requests release their permits in a few seconds. The
//! layer observes the hold times of its own permits (an exponentially
//! weighted mean per rule, in process, whichever the store) and answers a
//! concurrency denial with that estimate, at least a second, at most the
//! store's bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::info::RateLimitInfo;

/// The shortest retry a concurrency denial advertises: `Retry-After` counts
/// whole seconds, and a client told 0 would retry at once.
pub(crate) const MIN_RETRY: Duration = Duration::from_secs(1);

/// Per-layer hold-time estimates and the release notifications.
pub(crate) struct Holds {
    /// Mean hold time per rule, in nanoseconds; 0 before any release.
    mean_ns: Box<[AtomicU64]>,
    /// Signalled after this layer released permits of a key in the shard
    /// (by a hash of the key): a release wakes the waiters of its own keys
    /// and of the few that share their shard, not every waiter of the layer.
    released: Box<[Notify]>,
    /// Signalled after every release: for a request waiting on keys of
    /// several shards (several concurrency rules).
    any: Notify,
}

/// Release shards per layer: waiters of different keys rarely share one.
const SHARDS: usize = 64;

/// The shard of `key`: in process only, so a fixed-seed hash does (the
/// waiter and the releaser of one layer must agree).
fn shard(key: &[u8]) -> usize {
    use std::hash::BuildHasher;
    let hash = foldhash::fast::FixedState::default().hash_one(key);
    (hash % SHARDS as u64) as usize
}

impl Holds {
    pub(crate) fn new(rules: usize) -> Self {
        Holds {
            mean_ns: (0..rules).map(|_| AtomicU64::new(0)).collect(),
            released: (0..SHARDS).map(|_| Notify::new()).collect(),
            any: Notify::new(),
        }
    }

    /// Records that a permit of `rule` was held for `held`. Concurrent
    /// updates may lose one observation: an estimate, not an account.
    pub(crate) fn observe(&self, rule: usize, held: Duration) {
        let Some(mean) = self.mean_ns.get(rule) else {
            return;
        };
        let x = u64::try_from(held.as_nanos()).unwrap_or(u64::MAX).max(1);
        let old = mean.load(Ordering::Relaxed);
        // Weight 1/4: a handful of releases moves the estimate to a new regime.
        let new = if old == 0 { x } else { old - old / 4 + x / 4 };
        mean.store(new.max(1), Ordering::Relaxed);
    }

    /// The mean hold time of `rule`'s permits, if any was released yet.
    pub(crate) fn mean(&self, rule: usize) -> Option<Duration> {
        let ns = self.mean_ns.get(rule)?.load(Ordering::Relaxed);
        (ns > 0).then(|| Duration::from_nanos(ns))
    }

    /// Replaces the retry of every concurrency denial in `info` by the
    /// estimate: the mean hold time, at least [`MIN_RETRY`], at most the
    /// store's bound. Its `quota_after` (the `t` of `RateLimit`, the lease
    /// lapse) is lowered to the estimate too: `Retry-After` is never earlier
    /// than `t`.
    pub(crate) fn estimate_retries(&self, info: &mut RateLimitInfo) {
        for entry in info.entries_mut() {
            let d = &mut entry.decision;
            let Some(bound) = d.retry_after else { continue };
            if d.allowed || !entry.policy.is_concurrency() {
                continue;
            }
            let estimate = self.mean(entry.rule).unwrap_or(MIN_RETRY).max(MIN_RETRY);
            let retry = estimate.min(bound);
            d.retry_after = Some(retry);
            d.quota_after = d.quota_after.min(retry);
        }
    }

    /// Wakes the requests waiting for a permit of one of `keys` (the keys
    /// whose permits were just released).
    pub(crate) fn notify_released<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) {
        for key in keys {
            self.released[shard(key)].notify_waiters();
        }
        self.any.notify_waiters();
    }

    /// The notification of a release of one of `keys` (the waiting
    /// request's concurrency keys). Enable it before checking the store, so
    /// a release in between is not missed.
    pub(crate) fn released<'k>(&self, keys: impl IntoIterator<Item = &'k [u8]>) -> &Notify {
        let mut shards = keys.into_iter().map(shard);
        match shards.next() {
            Some(first) if shards.all(|s| s == first) => &self.released[first],
            // Keys in several shards, or none (then no release is awaited).
            _ => &self.any,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release wakes the waiters of its key's shard and those waiting on
    /// keys of several shards; waiters of other shards sleep on.
    #[test]
    fn a_release_wakes_its_shard_and_the_waiters_of_several() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let ready = |f: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>| {
            matches!(
                f.poll(&mut Context::from_waker(Waker::noop())),
                Poll::Ready(())
            )
        };
        let holds = Holds::new(1);
        let key = b"rule:alice".as_slice();
        let other = (0..)
            .map(|i| format!("rule:user-{i}").into_bytes())
            .find(|k| shard(k) != shard(key))
            .unwrap();
        let mut mine = std::pin::pin!(holds.released([key]).notified());
        let mut theirs = std::pin::pin!(holds.released([&other[..]]).notified());
        let mut both = std::pin::pin!(holds.released([key, &other[..]]).notified());
        for f in [mine.as_mut(), theirs.as_mut(), both.as_mut()] {
            f.enable();
        }
        holds.notify_released([key]);
        assert!(ready(mine.as_mut()));
        assert!(ready(both.as_mut()));
        assert!(!ready(theirs.as_mut()));
    }

    #[test]
    fn the_mean_follows_observations() {
        let holds = Holds::new(2);
        assert_eq!(holds.mean(0), None);
        holds.observe(0, Duration::from_secs(4));
        assert_eq!(holds.mean(0), Some(Duration::from_secs(4)));
        for _ in 0..40 {
            holds.observe(0, Duration::from_secs(2));
        }
        let mean = holds.mean(0).unwrap();
        assert!(
            mean >= Duration::from_secs(2) && mean < Duration::from_millis(2010),
            "{mean:?}"
        );
        assert_eq!(holds.mean(1), None);
        holds.observe(7, Duration::from_secs(1)); // no such rule: ignored
    }
}
