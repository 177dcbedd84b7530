//! Policies: what a limit is, validated once at construction.
//!
//! Every constructor returns a typed [`PolicyError`] instead of panicking or
//! wrapping around, so a limit read from configuration can be checked at start-up.

use std::fmt;
use std::time::Duration;

pub(crate) use crate::algorithm::{CellArgs, ConcurrencyParams, GcraParams, WindowParams};

/// A validated rate-limit policy. Cheap to copy; compare and hash by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
}

/// The algorithm behind a [`Policy`] and its validated parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// GCRA: redis-cell's `CL.THROTTLE`, the funnel and the token bucket.
    Gcra(GcraParams),
    /// An exact log of admitted events over a sliding window.
    SlidingLog(WindowParams),
    /// A counter per aligned window (`INCR` + `EXPIRE`).
    FixedWindow(WindowParams),
    /// Two window counters weighted by overlap: O(1) memory, near-exact.
    SlidingWindow(WindowParams),
    /// At most `max_in_flight` requests of a key in progress.
    Concurrency(ConcurrencyParams),
}

/// Why a policy could not be built.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A count, capacity or maximum was zero.
    ZeroCount(&'static str),
    /// A period, window or lease was zero.
    ZeroPeriod(&'static str),
    /// A duration or a product of parameters does not fit in 64-bit nanoseconds.
    Overflow(&'static str),
    /// The period divided by the count is below one nanosecond.
    IntervalTooShort {
        /// The period given.
        period: Duration,
        /// The count given.
        count: u64,
    },
    /// A rate was not a finite positive number.
    InvalidRate(f64),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::ZeroCount(what) => write!(f, "{what} must be at least 1"),
            PolicyError::ZeroPeriod(what) => write!(f, "{what} must be longer than zero"),
            PolicyError::Overflow(what) => {
                write!(
                    f,
                    "{what} does not fit in 64-bit nanoseconds (about 584 years)"
                )
            }
            PolicyError::IntervalTooShort { period, count } => write!(
                f,
                "{count} per {period:?} leaves less than one nanosecond per request"
            ),
            PolicyError::InvalidRate(rate) => {
                write!(f, "rate must be a finite number above zero, got {rate}")
            }
        }
    }
}

impl std::error::Error for PolicyError {}

/// Default lease of a concurrency permit that is never released.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

fn nanos(d: Duration, what: &'static str) -> Result<u64, PolicyError> {
    let ns = u64::try_from(d.as_nanos()).map_err(|_| PolicyError::Overflow(what))?;
    if ns == 0 {
        return Err(PolicyError::ZeroPeriod(what));
    }
    Ok(ns)
}

fn nonzero(n: u64, what: &'static str) -> Result<u64, PolicyError> {
    if n == 0 {
        Err(PolicyError::ZeroCount(what))
    } else {
        Ok(n)
    }
}

fn gcra(
    emission_interval_ns: u64,
    limit: u64,
    cell: Option<CellArgs>,
) -> Result<Policy, PolicyError> {
    let tolerance_ns = emission_interval_ns
        .checked_mul(limit)
        .ok_or(PolicyError::Overflow("emission interval × limit"))?;
    Ok(Policy {
        algorithm: Algorithm::Gcra(GcraParams {
            emission_interval_ns,
            tolerance_ns,
            limit,
            cell,
        }),
    })
}

fn interval_from_rate(per_sec: f64) -> Result<u64, PolicyError> {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return Err(PolicyError::InvalidRate(per_sec));
    }
    let interval = (1e9 / per_sec).round();
    if interval < 1.0 {
        return Err(PolicyError::InvalidRate(per_sec));
    }
    if interval >= u64::MAX as f64 {
        return Err(PolicyError::Overflow("1 / rate"));
    }
    Ok(interval as u64)
}

impl Policy {
    /// redis-cell's `CL.THROTTLE key max_burst count period`: `count` requests
    /// per `period`, with bursts of up to `max_burst + 1` from a fresh state.
    ///
    /// T = period / count in whole nanoseconds, divided exactly as redis-cell
    /// 0.5.0 divides (`(period_ns as f64 / count as f64) as i64`, which
    /// differs from integer division only for periods above about 104 days),
    /// and τ = T·(max_burst + 1).
    ///
    /// Replies are redis-cell's bit for bit on every store, `remaining`
    /// included: redis-cell computes it from whole **microseconds**
    /// (`trunc_µs(τ − ttl) / trunc_µs(T)` in `f64`), where
    /// [`Policy::funnel`] and [`Policy::token_bucket`] divide exact
    /// nanoseconds. The two can differ by one when T is not a whole number of
    /// microseconds: for `cell(100, 853, 3 s)` (T = 3,516,998 ns), after a
    /// cost of 2 at t = 0, a peek at t = T − 50 µs reports `remaining` 100
    /// here and in redis-cell, where the nanosecond formula gives 99.
    /// Admission itself is the same exact nanosecond GCRA for all three. One
    /// deliberate departure: with T under one microsecond redis-cell divides
    /// by zero and reports `remaining` = `i64::MAX`; this crate reports the
    /// exact quotient, never above the limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::Policy;
    ///
    /// let posts = Policy::cell(15, 30, Duration::from_secs(60))?;
    /// assert_eq!(posts.limit(), 16);
    /// assert!(Policy::cell(15, 0, Duration::from_secs(60)).is_err());
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn cell(max_burst: u64, count: u64, period: Duration) -> Result<Policy, PolicyError> {
        let args = CellArgs {
            max_burst,
            count,
            period,
        };
        let count = nonzero(count, "count")?;
        let period_ns = nanos(period, "period")?;
        // redis-cell's `Rate::per_period`, to the bit: an f64 quotient
        // truncated (`as` saturates; a u64 count and period never reach it).
        let emission_interval_ns = ((period_ns as f64) / (count as f64)) as u64;
        if emission_interval_ns == 0 {
            return Err(PolicyError::IntervalTooShort { period, count });
        }
        let limit = max_burst
            .checked_add(1)
            .ok_or(PolicyError::Overflow("max_burst + 1"))?;
        gcra(emission_interval_ns, limit, Some(args))
    }

    /// A funnel (leaky bucket as a meter) holding `capacity` units that leaks
    /// `leak_per_sec` units a second. Same machine as [`Policy::cell`] with
    /// T = 1 s / rate (rounded to the nanosecond) and limit = capacity.
    pub fn funnel(capacity: u64, leak_per_sec: f64) -> Result<Policy, PolicyError> {
        let capacity = nonzero(capacity, "capacity")?;
        gcra(interval_from_rate(leak_per_sec)?, capacity, None)
    }

    /// A token bucket (Guava's `RateLimiter` without warm-up) of `capacity`
    /// tokens refilled at `refill_per_sec`. Same machine as [`Policy::funnel`].
    pub fn token_bucket(capacity: u64, refill_per_sec: f64) -> Result<Policy, PolicyError> {
        let capacity = nonzero(capacity, "capacity")?;
        gcra(interval_from_rate(refill_per_sec)?, capacity, None)
    }

    /// At most `max` units in any window of length `window`, exactly: a log of
    /// admitted events (the classic ZSET log). Memory grows with `max` per key.
    pub fn sliding_log(max: u64, window: Duration) -> Result<Policy, PolicyError> {
        Ok(Policy {
            algorithm: Algorithm::SlidingLog(window_params(max, window)?),
        })
    }

    /// At most `max` units per aligned window (`floor(now / window)`): the
    /// `INCR` counter. Allows up to 2·max across a window boundary.
    pub fn fixed_window(max: u64, window: Duration) -> Result<Policy, PolicyError> {
        Ok(Policy {
            algorithm: Algorithm::FixedWindow(window_params(max, window)?),
        })
    }

    /// The sliding-window counter: `previous·(1 − elapsed/window) + current`
    /// must stay within `max`. O(1) memory per key whatever `max` is.
    pub fn sliding_window(max: u64, window: Duration) -> Result<Policy, PolicyError> {
        Ok(Policy {
            algorithm: Algorithm::SlidingWindow(window_params(max, window)?),
        })
    }

    /// At most `max_in_flight` requests of a key in progress at once, each
    /// permit leased for [`DEFAULT_LEASE`] in case its holder never releases it.
    pub fn concurrency(max_in_flight: u64) -> Result<Policy, PolicyError> {
        Self::concurrency_with_lease(max_in_flight, DEFAULT_LEASE)
    }

    /// [`Policy::concurrency`] with an explicit lease; make it longer than the
    /// slowest request you serve, or long requests lose their permit.
    pub fn concurrency_with_lease(
        max_in_flight: u64,
        lease: Duration,
    ) -> Result<Policy, PolicyError> {
        Ok(Policy {
            algorithm: Algorithm::Concurrency(ConcurrencyParams {
                max_in_flight: nonzero(max_in_flight, "max_in_flight")?,
                lease_ns: nanos(lease, "lease")?,
            }),
        })
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }

    /// The arguments given to [`Policy::cell`] (what
    /// [`CellStore`](crate::store::CellStore) sends to `CL.THROTTLE`); `None` for
    /// every other constructor, funnels and token buckets included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::Policy;
    ///
    /// let p = Policy::cell(15, 30, Duration::from_secs(60))?;
    /// let args = p.cell_args().unwrap();
    /// assert_eq!((args.max_burst, args.count, args.period.as_secs()), (15, 30, 60));
    /// assert!(Policy::token_bucket(16, 0.5)?.cell_args().is_none());
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn cell_args(&self) -> Option<CellArgs> {
        match self.algorithm {
            Algorithm::Gcra(p) => p.cell,
            Algorithm::SlidingLog(_)
            | Algorithm::FixedWindow(_)
            | Algorithm::SlidingWindow(_)
            | Algorithm::Concurrency(_) => None,
        }
    }

    /// Requests admitted at once from a fresh state.
    pub fn limit(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra(p) => p.limit,
            Algorithm::SlidingLog(p) | Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) => {
                p.max
            }
            Algorithm::Concurrency(p) => p.max_in_flight,
        }
    }

    /// The window over which [`Policy::limit`] is counted: τ for GCRA, the
    /// window for window algorithms, the lease for concurrency. Used for the
    /// `w` parameter of the `RateLimit-Policy` header.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(match self.algorithm {
            Algorithm::Gcra(p) => p.tolerance_ns,
            Algorithm::SlidingLog(p) | Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) => {
                p.window_ns
            }
            Algorithm::Concurrency(p) => p.lease_ns,
        })
    }

    /// Writes the tag that keeps a key's state under `self` apart from its
    /// state under `default` (the rule's own policy), when the two cannot
    /// share it: another algorithm, or a fixed or sliding window of another
    /// length (their state counts numbered windows, which mean other spans
    /// under another length). Returns false, writing nothing, when the state
    /// is shared: GCRA (the theoretical arrival time is an instant), the
    /// sliding log (instants), concurrency (leases that end at instants),
    /// and windows of the same length. See [`crate::resolve`].
    pub(crate) fn write_state_tag(&self, default: &Policy, out: &mut Vec<u8>) -> bool {
        let (code, window_ns) = match (self.algorithm, default.algorithm) {
            (Algorithm::Gcra(_), Algorithm::Gcra(_))
            | (Algorithm::SlidingLog(_), Algorithm::SlidingLog(_))
            | (Algorithm::Concurrency(_), Algorithm::Concurrency(_)) => return false,
            (Algorithm::FixedWindow(p), Algorithm::FixedWindow(d))
            | (Algorithm::SlidingWindow(p), Algorithm::SlidingWindow(d))
                if p.window_ns == d.window_ns =>
            {
                return false
            }
            (Algorithm::Gcra(_), _) => (b'g', 0),
            (Algorithm::SlidingLog(_), _) => (b'l', 0),
            (Algorithm::Concurrency(_), _) => (b'c', 0),
            (Algorithm::FixedWindow(p), _) => (b'f', p.window_ns),
            (Algorithm::SlidingWindow(p), _) => (b's', p.window_ns),
        };
        // `~` never appears in a rule name, so a tagged namespace cannot
        // be another rule's.
        out.push(b'~');
        out.push(code);
        if window_ns > 0 {
            out.extend_from_slice(window_ns.to_string().as_bytes());
        }
        true
    }

    /// True for [`Policy::concurrency`]: admitted checks hold a permit to release.
    pub fn is_concurrency(&self) -> bool {
        matches!(self.algorithm, Algorithm::Concurrency(_))
    }
}

fn window_params(max: u64, window: Duration) -> Result<WindowParams, PolicyError> {
    Ok(WindowParams {
        max: nonzero(max, "max")?,
        window_ns: nanos(window, "window")?,
    })
}

pub(crate) mod reserve;

pub(crate) use reserve::{effective_policy, rebase};

#[cfg(test)]
mod tests;
