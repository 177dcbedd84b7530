//! The algorithms as pure transitions: `(state, now, cost) → decision`, then
//! `admit` to produce the new state when — and only when — the decision allows.
//!
//! No I/O and no clock here: the memory store, the Redis scripts and the
//! reference models in the tests all implement these definitions. Times are
//! `u64` nanoseconds; arithmetic that could overflow is done in `u128` or
//! saturates, so a clock that jumps backwards never panics and never admits
//! more than the policy allows.
//!
//! `check` never mutates: a denied check changes no state. `prune` functions
//! drop expired entries, which changes no decision (housekeeping only).

mod params;

pub use params::{CellArgs, ConcurrencyParams, GcraParams, WindowParams};
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;

#[cfg(test)]
mod quota_tests;
#[cfg(test)]
mod receipt_tests;

use std::time::Duration;

#[inline]
pub(crate) fn dur(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

#[inline]
pub(crate) fn sat(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
