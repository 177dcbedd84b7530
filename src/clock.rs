//! Time sources for the in-memory store.
//!
//! Algorithms see time as `u64` nanoseconds on one monotonic line. The system
//! clock anchors that line to the Unix epoch once, at construction, and then
//! advances it with a calibrated TSC reading ([`quanta`], about 10 ns against
//! about 20 ns for [`std::time::Instant`]; it falls back to the OS monotonic
//! clock where the TSC is unusable), so fixed windows line up with wall time.
//! Should the counter ever step back (unsynchronised cores), the algorithms
//! stay safe: a clock that goes back never admits more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of monotonic time in nanoseconds.
///
/// Implementations must be cheap: the memory store reads the clock once per check.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's epoch.
    fn now_ns(&self) -> u64;
}

/// The production clock: monotonic, anchored to Unix time at creation.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: u64,
    origin_unix_ns: u64,
}

impl SystemClock {
    /// Anchors a new monotonic clock at the current wall time.
    pub fn new() -> Self {
        // The first clock of a process calibrates (about half a
        // millisecond): the wall time is read after it, beside the origin,
        // or every reading would lag the Unix time by the calibration.
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        let origin_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
            .unwrap_or(0);
        SystemClock {
            origin,
            clock,
            origin_unix_ns,
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        let elapsed = self.clock.delta_as_nanos(self.origin, self.clock.raw());
        self.origin_unix_ns.saturating_add(elapsed)
    }
}

/// A clock that moves only when told to; clones share one time. For tests.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let t0 = clock.now_ns();
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now_ns() - t0, 1_500_000_000);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    now_ns: Arc<AtomicU64>,
}

impl ManualClock {
    /// Starts at an arbitrary non-zero instant (one day after the epoch), so
    /// that "a time before the first check" is representable.
    pub fn new() -> Self {
        Self::starting_at(86_400 * 1_000_000_000)
    }

    /// Starts at `now_ns` nanoseconds.
    pub fn starting_at(now_ns: u64) -> Self {
        ManualClock {
            now_ns: Arc::new(AtomicU64::new(now_ns)),
        }
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .now_ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time, which may move it backwards (to test clock faults).
    pub fn set_ns(&self, now_ns: u64) {
        self.now_ns.store(now_ns, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_monotonic_and_near_unix_time() {
        let clock = SystemClock::new();
        let a = clock.now_ns();
        let b = clock.now_ns();
        assert!(b >= a);
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let diff = (unix.as_nanos() as i128 - a as i128).abs();
        assert!(
            diff < 5_000_000_000,
            "anchored to wall time, off by {diff} ns"
        );
    }

    #[test]
    fn manual_clock_saturates_instead_of_wrapping() {
        let clock = ManualClock::starting_at(u64::MAX - 1);
        clock.advance(Duration::from_secs(10));
        assert_eq!(clock.now_ns(), u64::MAX);
    }
}
