//! Policies as script arguments, with the bounds that keep every Lua number
//! an exact integer: a count and a duration in nanoseconds, under one code
//! per algorithm. GCRA runs in ns throughout (its tats kept modulo
//! 1000·2^43 ns, see gcra.lua); a window, log or lease runs in µs where it
//! is whole µs, else in ns (`pick` in common.lua).
//!
//! Lua numbers are doubles: integers are exact below 2^53. Times are µs
//! since the epoch (about 1.8·10^15 today, and the scripts refuse a `now`
//! at or beyond 2^52, in the year 2112); each policy is checked here so that
//! nothing a script computes from it can reach 2^53.

use super::registry::ScriptAlgorithm;
use crate::policy::{Algorithm, Policy};
use crate::store::StoreError;

/// Largest duration a policy may span in the scripts: 2^50 µs (about 35 years).
pub(crate) const MAX_SPAN_US: u128 = 1 << 50;
/// Bound on `now` accepted from a client clock (the scripts enforce it too).
pub(crate) const MAX_NOW_US: u64 = 1 << 52;

/// Bound on a GCRA policy's tolerance, in ns (about 50.9 days): the script
/// reads a tat stored modulo twice this as its offset within this of now
/// (and T·(limit + 1) stays below twice this).
pub(crate) const MAX_GCRA_NS: u128 = 1000 << 42;

// A reservation's stretched policy always runs here.
const _: () = assert!((crate::policy::reserve::MAX_RESERVED_TOLERANCE_NS as u128) < MAX_GCRA_NS);

/// Largest sliding-log limit on Redis: the log holds one sorted-set member per
/// admitted unit, and one check of cost `max` writes `max` members while the
/// server runs nothing else. Larger limits belong to
/// [`Policy::sliding_window`], which is O(1) per key.
pub(crate) const MAX_LOG_ENTRIES: u64 = 10_000;

/// A policy's two script parameters (a count, and a duration in ns) and its
/// limit, validated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub algorithm: ScriptAlgorithm,
    pub p1: u64,
    pub p2: u64,
    pub limit: u64,
}

/// A window, log or lease of `duration_ns`, within the scripts' span: in
/// whole µs the scripts run it in µs; otherwise they take its exact (µs, ns)
/// pair from its digits (`dur_param` in common.lua) and divide by it exactly
/// (`win_divmod` in window.lua), so either way only its µs must stay below
/// 2^50.
fn span(duration_ns: u64, what: &'static str) -> Result<u64, StoreError> {
    if u128::from(duration_ns / 1000) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(what));
    }
    Ok(duration_ns)
}

/// A count the scripts hold exactly.
fn count(max: u64, what: &'static str) -> Result<u64, StoreError> {
    if u128::from(max) > MAX_SPAN_US {
        return Err(StoreError::Unsupported(what));
    }
    Ok(max)
}

/// Why a GCRA policy beyond the scripts' range is refused.
const GCRA_TOO_LONG: &str = "GCRA policies whose tolerance (emission interval × limit) reaches \
                             1000·2^42 ns (50 days) on Redis (Lua numbers are doubles); use a \
                             fixed or sliding window for longer periods";
/// Why a concurrency policy outside the exact range is refused.
const TOO_BIG: &str = "concurrency limits above 2^50 permits or leases above 2^50 µs \
                       (35 years) on Redis (Lua numbers are doubles)";
/// The refusal of windows (fixed or sliding) beyond the scripts' span.
const LONG_WINDOW: &str = "windows and logs above 2^50 µs (35 years) on Redis";
/// The refusal of limits the scripts' counts cannot hold exactly.
const BIG_COUNT: &str = "limits above 2^50 on Redis (Lua numbers are doubles)";

impl Params {
    /// Validates `policy` for the scripts.
    pub(crate) fn of(policy: &Policy) -> Result<Params, StoreError> {
        let (p1, p2, limit) = match *policy.algorithm() {
            Algorithm::Gcra(p) => {
                // In ns (gcra.lua): tats are read modulo 1000·2^43 ns as
                // offsets within half of that of now, and a check's T·cost
                // (cost at most limit + 1) stays exact.
                let reach = u128::from(p.emission_interval_ns) * (u128::from(p.limit) + 1);
                if u128::from(p.tolerance_ns) >= MAX_GCRA_NS || reach >= 2 * MAX_GCRA_NS {
                    return Err(StoreError::Unsupported(GCRA_TOO_LONG));
                }
                (p.emission_interval_ns, p.tolerance_ns, p.limit)
            }
            Algorithm::SlidingLog(p) if p.max > MAX_LOG_ENTRIES => {
                return Err(StoreError::Unsupported(
                    "sliding logs above 10,000 per window on Redis (one member per unit blocks \
                     the server); use Policy::sliding_window",
                ));
            }
            // Windows from 1 ns; counts below 2^50, and the sliding window's
            // products exact at any size (`win_fits`).
            Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) | Algorithm::SlidingLog(p) => {
                let max = count(p.max, BIG_COUNT)?;
                (max, span(p.window_ns, LONG_WINDOW)?, max)
            }
            Algorithm::Concurrency(p) => {
                let max = count(p.max_in_flight, TOO_BIG)?;
                (max, span(p.lease_ns, TOO_BIG)?, max)
            }
        };
        Ok(Params {
            algorithm: ScriptAlgorithm::of(policy),
            p1,
            p2,
            limit,
        })
    }

    /// Whether the duration is whole µs (the scripts then run the window,
    /// log or lease in µs).
    pub(crate) fn whole_us(&self) -> bool {
        self.p2.is_multiple_of(1000)
    }

    /// The cost the script sees: any cost above the limit is denied forever
    /// whatever the state, so `limit + 1` decides the same and stays exact.
    pub(crate) fn script_cost(&self, cost: u64) -> u64 {
        cost.min(self.limit + 1)
    }

    /// A refund the script can compute exactly: giving back more than the
    /// state can hold empties it all the same.
    pub(crate) fn script_amount(&self, amount: u64) -> u64 {
        let cap = match self.algorithm {
            // tat − T·amount, exact: a receipt holds at most the limit,
            // and T·(limit + 1) stays below 2^53 ns.
            ScriptAlgorithm::Gcra => self.limit.saturating_add(1),
            ScriptAlgorithm::FixedWindow
            | ScriptAlgorithm::SlidingWindow
            | ScriptAlgorithm::SlidingLog
            | ScriptAlgorithm::Concurrency => MAX_NOW_US,
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
        assert_eq!(Params::of(&ok).unwrap().p1, 2_000_000_000);
        let thirds = Policy::funnel(3, 3.0).unwrap(); // T = 333_333_333 ns
        let p = Params::of(&thirds).unwrap();
        assert_eq!(
            (p.algorithm, p.p1, p.p2),
            (ScriptAlgorithm::Gcra, 333_333_333, 999_999_999)
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
        assert_eq!(
            (p.algorithm, p.p2, p.whole_us()),
            (ScriptAlgorithm::FixedWindow, 1500, false)
        );
        let third = Policy::sliding_window(10, Duration::from_nanos(333_333_333)).unwrap();
        assert!(!Params::of(&third).unwrap().whole_us());
        let whole = Policy::sliding_window(10, Duration::from_micros(1500)).unwrap();
        assert_eq!(Params::of(&whole).unwrap().p2, 1_500_000);
        assert!(Params::of(&whole).unwrap().whole_us());
        // Windows from 1 ns, and not whole µs beyond 2^49 ns, run in ns.
        for odd in [1, 999, (1 << 49) + 1, (1 << 53) + 1] {
            let p = Policy::fixed_window(1, Duration::from_nanos(odd)).unwrap();
            assert!(!Params::of(&p).unwrap().whole_us());
        }
        let beyond = Policy::fixed_window(1, Duration::from_nanos((1 << 60) + 1)).unwrap();
        assert!(matches!(
            Params::of(&beyond),
            Err(StoreError::Unsupported(_))
        ));
        let short = Policy::sliding_log(1, Duration::from_nanos(999)).unwrap();
        assert!(!Params::of(&short).unwrap().whole_us());
        let lease = Policy::concurrency_with_lease(1, Duration::from_nanos(1)).unwrap();
        assert_eq!(Params::of(&lease).unwrap().p2, 1);
        // Any product of a count and a window: the script compares in limbs.
        let odd = Policy::sliding_window(1 << 20, Duration::from_nanos(1 << 40 | 1)).unwrap();
        assert!(!Params::of(&odd).unwrap().whole_us());
        let big = Policy::sliding_window(1 << 40, Duration::from_secs(3600)).unwrap();
        assert!(Params::of(&big).unwrap().whole_us());
        let huge = Policy::sliding_window((1 << 50) + 1, Duration::from_secs(1)).unwrap();
        assert!(matches!(Params::of(&huge), Err(StoreError::Unsupported(_))));
        let fine = Policy::sliding_window(1_000_000, Duration::from_secs(60)).unwrap();
        assert!(Params::of(&fine).is_ok());
        let long = Policy::sliding_log(1, Duration::from_secs(3600 * 24 * 365 * 40)).unwrap();
        assert!(Params::of(&long).is_err());
    }

    #[test]
    fn no_gcra_policy_within_the_bounds_is_refused() {
        // count 1–10^6 × period 1 s – 50 days (sampled), bursts up to
        // count − 1 (a tolerance of at most the period), funnels at any
        // rate: every one runs on Redis.
        let mut refused = Vec::new();
        let periods = (1..=50 * 86_400u64)
            .step_by(7_919)
            .chain([60, 86_400, 50 * 86_400]);
        for period in periods {
            for count in (1..=1000u64).chain((1_000..=1_000_000).step_by(99_991)) {
                for burst in [0, count / 2, count - 1] {
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

    #[test]
    fn gcra_tolerances_from_1000_times_2_to_the_42_ns_are_refused_with_a_typed_error() {
        // One unit at a time: tau = T.
        let at = |tau_ns: u64| Policy::cell(0, 1, Duration::from_nanos(tau_ns)).unwrap();
        let last = (1000u64 << 42) - 1;
        let p = Params::of(&at(last)).unwrap();
        assert_eq!(
            (p.algorithm, p.p1, p.p2),
            (ScriptAlgorithm::Gcra, last, last)
        );
        for refused in [last + 1, 1 << 53, u64::MAX / 2] {
            let e = Params::of(&at(refused)).unwrap_err();
            assert!(
                matches!(e, StoreError::Unsupported(why) if why.contains("50 days")),
                "{refused}"
            );
        }
        // A month at 5 a month runs; a year does not.
        let month = Duration::from_secs(30 * 86_400);
        assert!(Params::of(&Policy::cell(4, 5, month).unwrap()).is_ok());
        let year = Duration::from_secs(365 * 86_400);
        assert!(Params::of(&Policy::cell(0, 1, year).unwrap()).is_err());
        // The refund bound: a receipt never holds more than the limit.
        let p = Params::of(&Policy::cell(4, 5, month).unwrap()).unwrap();
        assert_eq!(p.script_amount(u64::MAX), p.limit + 1);
    }
}
