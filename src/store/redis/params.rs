//! Policies as script arguments, in microseconds (in nanoseconds for the
//! codes 'n', 'F', 'S', 'L' and 'C' of durations that are not whole µs), with
//! the bounds that keep every Lua number an exact integer.
//!
//! Lua numbers are doubles: integers are exact below 2^53. Times are µs
//! since the epoch (about 1.8·10^15 today, and the scripts refuse a `now`
//! at or beyond 2^52, in the year 2112); each policy is checked here so that
//! nothing a script computes from it can reach 2^53.

use super::registry::{Code, ScriptAlgorithm};
use crate::policy::{Algorithm, Policy, WindowParams};
use crate::store::StoreError;

/// Largest duration a policy may span in the scripts: 2^50 µs (about 35 years).
pub(crate) const MAX_SPAN_US: u128 = 1 << 50;
/// Bound on `now` accepted from a client clock (the scripts enforce it too).
pub(crate) const MAX_NOW_US: u64 = 1 << 52;

/// Bound on a nanosecond-precision GCRA's `limit + 2` (and on a refund's
/// units): the script's ns limb of T·n, below 1000·n, stays exact.
pub(crate) const MAX_NS_UNITS: u128 = 1 << 43;

/// Largest sliding-log limit on Redis: the log holds one sorted-set member per
/// admitted unit, and one check of cost `max` writes `max` members while the
/// server runs nothing else. Larger limits belong to
/// [`Policy::sliding_window`], which is O(1) per key.
pub(crate) const MAX_LOG_ENTRIES: u64 = 10_000;

/// A policy's two script parameters and its limit, validated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub code: Code,
    pub p1: u64,
    pub p2: u64,
    pub limit: u64,
}

fn micros(ns: u64, what: &'static str) -> Result<u64, StoreError> {
    if !ns.is_multiple_of(1000) {
        return Err(StoreError::Unsupported(what));
    }
    Ok(ns / 1000)
}

/// A window, log or lease in ns that is not a whole number of microseconds
/// (codes 'F', 'S', 'L' and 'C'): the scripts take its exact (µs, ns) pair
/// from its digits (`dur_param` in common.lua) and divide by it exactly
/// (`win_divmod` in window.lua), so it only needs its µs below 2^50.
fn ns_span(window_ns: u64, what: &'static str) -> Result<u64, StoreError> {
    if u128::from(window_ns / 1000) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(what));
    }
    Ok(window_ns)
}

/// A log's or window's window in whole µs, within the exact range.
fn whole_window(p: &WindowParams) -> Result<u64, StoreError> {
    let w = micros(
        p.window_ns,
        "windows that are not whole microseconds on Redis",
    )?;
    if u128::from(w) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(LONG_WINDOW));
    }
    if u128::from(p.max) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(BIG_COUNT));
    }
    Ok(w)
}

/// A fixed or sliding window that is not whole µs, as `code`.
fn ns_window(code: Code, p: &WindowParams) -> Result<Params, StoreError> {
    let w = ns_span(p.window_ns, LONG_WINDOW)?;
    if u128::from(p.max) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(BIG_COUNT));
    }
    Ok(Params {
        code,
        p1: p.max,
        p2: w,
        limit: p.max,
    })
}

/// Why a GCRA or concurrency policy outside the exact range is refused.
const TOO_BIG: &str =
    "policies whose limit × interval reaches 2^50 µs on Redis (Lua numbers are doubles)";
/// The refusal of windows (fixed or sliding) beyond the scripts' span.
const LONG_WINDOW: &str = "windows and logs above 2^50 µs (35 years) on Redis";
/// The refusal of limits the scripts' counts cannot hold exactly.
const BIG_COUNT: &str = "limits above 2^50 on Redis (Lua numbers are doubles)";

impl Params {
    /// Validates `policy` for the scripts.
    pub(crate) fn of(policy: &Policy) -> Result<Params, StoreError> {
        let params = Self::encode(policy)?;
        debug_assert_eq!(params.code.algorithm(), ScriptAlgorithm::of(policy));
        Ok(params)
    }

    fn encode(policy: &Policy) -> Result<Params, StoreError> {
        let too_big = StoreError::Unsupported(TOO_BIG);
        let (code, p1, p2, limit) = match *policy.algorithm() {
            Algorithm::Gcra(p)
                if p.emission_interval_ns % 1000 == 0 && p.tolerance_ns % 1000 == 0 =>
            {
                let (t, tau) = (p.emission_interval_ns / 1000, p.tolerance_ns / 1000);
                // A check costs at most limit + 1 units in the script.
                if u128::from(t) * (u128::from(p.limit) + 2) > MAX_SPAN_US {
                    return Err(too_big);
                }
                (Code::Gcra, t, tau, p.limit)
            }
            Algorithm::Gcra(p) => {
                // Nanosecond precision (gcra_ns.lua): T and tau travel in ns
                // and the script splits them into exact (µs, ns) pairs;
                // T·cost's ns limb needs (limit + 2)·1000 below 2^53.
                let t_us = u128::from(p.emission_interval_ns.div_ceil(1000));
                let units = u128::from(p.limit) + 2;
                if t_us * units > MAX_SPAN_US || units >= MAX_NS_UNITS {
                    return Err(too_big);
                }
                return Ok(Params {
                    code: Code::GcraNs,
                    p1: p.emission_interval_ns,
                    p2: p.tolerance_ns,
                    limit: p.limit,
                });
            }
            Algorithm::SlidingLog(p) if p.max > MAX_LOG_ENTRIES => {
                return Err(StoreError::Unsupported(
                    "sliding logs above 10,000 per window on Redis (one member per unit blocks \
                     the server); use Policy::sliding_window",
                ));
            }
            // Nanosecond windows (codes 'F' and 'S'), from 1 ns: see ns_span.
            // Counts stay below 2^50, and the sliding window's products are
            // exact at any size (`win_fits`).
            Algorithm::FixedWindow(p) if !p.window_ns.is_multiple_of(1000) => {
                return ns_window(Code::FixedWindowNs, &p);
            }
            Algorithm::SlidingWindow(p) if !p.window_ns.is_multiple_of(1000) => {
                return ns_window(Code::SlidingWindowNs, &p);
            }
            Algorithm::SlidingLog(p) if !p.window_ns.is_multiple_of(1000) => {
                // Code 'L': times stay whole µs, the window travels in ns
                // (see sliding_log.lua).
                let w = ns_span(
                    p.window_ns,
                    "sliding logs above 2^50 µs (35 years) on Redis",
                )?;
                return Ok(Params {
                    code: Code::SlidingLogNs,
                    p1: p.max,
                    p2: w,
                    limit: p.max,
                });
            }
            Algorithm::SlidingLog(p) => (Code::SlidingLog, p.max, whole_window(&p)?, p.max),
            Algorithm::FixedWindow(p) => (Code::FixedWindow, p.max, whole_window(&p)?, p.max),
            Algorithm::SlidingWindow(p) => (Code::SlidingWindow, p.max, whole_window(&p)?, p.max),
            Algorithm::Concurrency(p) if !p.lease_ns.is_multiple_of(1000) => {
                // Code 'C': expiries as exact (µs, ns) pairs (concurrency.lua).
                let lease = ns_span(p.lease_ns, "leases above 2^50 µs (35 years) on Redis")?;
                if u128::from(p.max_in_flight) > MAX_SPAN_US {
                    return Err(too_big);
                }
                return Ok(Params {
                    code: Code::ConcurrencyNs,
                    p1: p.max_in_flight,
                    p2: lease,
                    limit: p.max_in_flight,
                });
            }
            Algorithm::Concurrency(p) => {
                let lease = micros(
                    p.lease_ns,
                    "concurrency leases that are not whole microseconds on Redis",
                )?;
                if u128::from(lease) > MAX_SPAN_US || u128::from(p.max_in_flight) > MAX_SPAN_US {
                    return Err(too_big);
                }
                (Code::Concurrency, p.max_in_flight, lease, p.max_in_flight)
            }
        };
        Ok(Params {
            code,
            p1,
            p2,
            limit,
        })
    }

    /// The cost the script sees: any cost above the limit is denied forever
    /// whatever the state, so `limit + 1` decides the same and stays exact.
    pub(crate) fn script_cost(&self, cost: u64) -> u64 {
        cost.min(self.limit + 1)
    }

    /// A refund the script can compute exactly: giving back more than the
    /// state can hold empties it all the same.
    pub(crate) fn script_amount(&self, amount: u64) -> u64 {
        let cap = match self.code {
            // tat − T·amount: beyond 2^52 / T units tat is at `now` anyway.
            Code::Gcra => (MAX_NOW_US / self.p1.max(1)).saturating_add(2),
            // The same bound for a T in ns, and the exact ns limb's.
            Code::GcraNs => (MAX_NOW_US / (self.p1 / 1000).max(1))
                .saturating_add(2)
                .min(MAX_NS_UNITS as u64 - 1),
            Code::FixedWindow
            | Code::FixedWindowNs
            | Code::SlidingWindow
            | Code::SlidingWindowNs
            | Code::SlidingLog
            | Code::SlidingLogNs
            | Code::Concurrency
            | Code::ConcurrencyNs => MAX_NOW_US,
        };
        amount.min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sub_microsecond_and_oversized_policies_are_typed_errors() {
        let ok = Policy::cell(15, 30, Duration::from_secs(60)).unwrap();
        assert_eq!(Params::of(&ok).unwrap().p1, 2_000_000);
        let thirds = Policy::funnel(3, 3.0).unwrap(); // T = 333_333_333 ns
        let p = Params::of(&thirds).unwrap();
        assert_eq!(
            (p.code, p.p1, p.p2),
            (Code::GcraNs, 333_333_333, 999_999_999)
        );
        let huge_log = Policy::sliding_log(MAX_LOG_ENTRIES + 1, Duration::from_secs(60)).unwrap();
        assert!(matches!(
            Params::of(&huge_log),
            Err(StoreError::Unsupported(_))
        ));
        let log = Policy::sliding_log(MAX_LOG_ENTRIES, Duration::from_secs(60)).unwrap();
        assert!(Params::of(&log).is_ok());
        let ns = Policy::fixed_window(1, Duration::from_nanos(1500)).unwrap();
        let p = Params::of(&ns).unwrap();
        assert_eq!((p.code, p.p2), (Code::FixedWindowNs, 1500));
        let third = Policy::sliding_window(10, Duration::from_nanos(333_333_333)).unwrap();
        assert_eq!(Params::of(&third).unwrap().code, Code::SlidingWindowNs);
        let whole = Policy::sliding_window(10, Duration::from_micros(1500)).unwrap();
        assert_eq!(Params::of(&whole).unwrap().code, Code::SlidingWindow);
        // Windows from 1 ns, and not whole µs beyond 2^49 ns, run in ns.
        for odd in [1, 999, (1 << 49) + 1, (1 << 53) + 1] {
            let p = Policy::fixed_window(1, Duration::from_nanos(odd)).unwrap();
            assert_eq!(Params::of(&p).unwrap().code, Code::FixedWindowNs);
        }
        let beyond = Policy::fixed_window(1, Duration::from_nanos((1 << 60) + 1)).unwrap();
        assert!(matches!(
            Params::of(&beyond),
            Err(StoreError::Unsupported(_))
        ));
        let short = Policy::sliding_log(1, Duration::from_nanos(999)).unwrap();
        assert_eq!(Params::of(&short).unwrap().code, Code::SlidingLogNs);
        let lease = Policy::concurrency_with_lease(1, Duration::from_nanos(1)).unwrap();
        assert_eq!(Params::of(&lease).unwrap().code, Code::ConcurrencyNs);
        // Any product of a count and a window: the script compares in limbs.
        let odd = Policy::sliding_window(1 << 20, Duration::from_nanos(1 << 40 | 1)).unwrap();
        assert_eq!(Params::of(&odd).unwrap().code, Code::SlidingWindowNs);
        let big = Policy::sliding_window(1 << 40, Duration::from_secs(3600)).unwrap();
        assert_eq!(Params::of(&big).unwrap().code, Code::SlidingWindow);
        let huge = Policy::sliding_window((1 << 50) + 1, Duration::from_secs(1)).unwrap();
        assert!(matches!(Params::of(&huge), Err(StoreError::Unsupported(_))));
        let fine = Policy::sliding_window(1_000_000, Duration::from_secs(60)).unwrap();
        assert!(Params::of(&fine).is_ok());
        let long = Policy::sliding_log(1, Duration::from_secs(3600 * 24 * 365 * 40)).unwrap();
        assert!(Params::of(&long).is_err());
    }

    #[test]
    fn no_gcra_policy_within_the_bounds_is_refused() {
        // count 1–10^6 × period 1 s – 1 year (sampled), bursts up to count,
        // funnels at any rate: every one runs on Redis.
        let mut refused = Vec::new();
        let periods = (1..=365 * 86_400u64)
            .step_by(7_919)
            .chain([60, 86_400, 365 * 86_400]);
        for period in periods {
            for count in (1..=1000u64).chain((1_000..=1_000_000).step_by(99_991)) {
                for burst in [0, count / 2, count] {
                    let p = Policy::cell(burst, count, Duration::from_secs(period)).unwrap();
                    if Params::of(&p).is_err() {
                        refused.push((burst, count, period));
                    }
                }
            }
        }
        for rate in [3.0, 7.0 / 60.0, 1e-3, 1e6, 2.9e8] {
            if Params::of(&Policy::funnel(1000, rate).unwrap()).is_err() {
                refused.push((1000, 0, rate as u64));
            }
        }
        assert_eq!(refused, []);
    }
}
