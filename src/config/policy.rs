//! A policy as a file writes it: one key naming the algorithm.

use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::duration::{duration, optional_duration};
use crate::policy::Policy;

/// A policy: one key naming the algorithm, holding its parameters.
///
/// ```yaml
/// policy: { sliding_log: { limit: 5, window: 60s } }
/// policy: { cell: { max_burst: 15, count: 30, period: 1h } }
/// ```
///
/// `cell` takes redis-cell's `CL.THROTTLE` arguments: `max_burst` requests
/// beyond the first are admitted at once (16 here), then `count` per
/// `period`. The older spelling `burst` is read the same way, with a
/// warning: it was taken for the number admitted at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig(pub Policy);

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum PolicySpec {
    Cell(CellSpec),
    TokenBucket(BucketSpec),
    Funnel(BucketSpec),
    SlidingLog(WindowSpec),
    FixedWindow(WindowSpec),
    SlidingWindow(WindowSpec),
    Concurrency(ConcurrencySpec),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CellSpec {
    #[serde(default)]
    max_burst: Option<u64>,
    /// The older spelling of `max_burst`.
    #[serde(default)]
    burst: Option<u64>,
    count: u64,
    #[serde(deserialize_with = "duration")]
    period: Duration,
}

impl CellSpec {
    /// `max_burst`, or `burst` with a warning; not both.
    fn max_burst<E: serde::de::Error>(&self) -> Result<u64, E> {
        match (self.max_burst, self.burst) {
            (Some(n), None) => Ok(n),
            (None, Some(n)) => {
                tracing::warn!(
                    target: "tower_throttle",
                    burst = n,
                    "a `cell` policy's `burst` is redis-cell's max_burst: {} requests are admitted at once; write `max_burst: {n}` to say so",
                    n.saturating_add(1)
                );
                Ok(n)
            }
            (Some(_), Some(_)) => Err(E::custom(
                "write `max_burst` alone (`burst` is its older spelling)",
            )),
            (None, None) => Err(E::missing_field("max_burst")),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketSpec {
    capacity: u64,
    per_second: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowSpec {
    limit: u64,
    #[serde(deserialize_with = "duration")]
    window: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConcurrencySpec {
    max_in_flight: u64,
    #[serde(default, deserialize_with = "optional_duration")]
    lease: Option<Duration>,
}

impl<'de> Deserialize<'de> for PolicyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let policy = match PolicySpec::deserialize(d)? {
            PolicySpec::Cell(c) => Policy::cell(c.max_burst::<D::Error>()?, c.count, c.period),
            PolicySpec::TokenBucket(b) => Policy::token_bucket(b.capacity, b.per_second),
            PolicySpec::Funnel(b) => Policy::funnel(b.capacity, b.per_second),
            PolicySpec::SlidingLog(w) => Policy::sliding_log(w.limit, w.window),
            PolicySpec::FixedWindow(w) => Policy::fixed_window(w.limit, w.window),
            PolicySpec::SlidingWindow(w) => Policy::sliding_window(w.limit, w.window),
            PolicySpec::Concurrency(c) => match c.lease {
                Some(lease) => Policy::concurrency_with_lease(c.max_in_flight, lease),
                None => Policy::concurrency(c.max_in_flight),
            },
        };
        policy.map(PolicyConfig).map_err(D::Error::custom)
    }
}
