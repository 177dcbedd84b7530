//! The validated parameters each algorithm runs on (built by
//! [`Policy`](crate::Policy)'s constructors).

use std::time::Duration;

/// GCRA parameters, in redis-cell's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GcraParams {
    /// T: the time one unit of quota takes to come back, in nanoseconds.
    pub emission_interval_ns: u64,
    /// τ = T·limit: how far ahead of now the theoretical arrival time may run.
    pub tolerance_ns: u64,
    /// Requests admitted at once from a fresh state (`max_burst + 1`).
    pub limit: u64,
    /// The arguments given to [`Policy::cell`](crate::Policy::cell), `None` for the other GCRA
    /// constructors. When set, `remaining` is computed as redis-cell 0.5.0
    /// computes it (in whole microseconds, through `f64`), and
    /// [`CellStore`](crate::store::CellStore) sends these arguments as they are.
    pub cell: Option<CellArgs>,
}

/// The arguments of [`Policy::cell`](crate::Policy::cell), as the user gave them: redis-cell's
/// `CL.THROTTLE key max_burst count period`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CellArgs {
    /// `max_burst`: a fresh key admits `max_burst + 1` at once.
    pub max_burst: u64,
    /// `count` requests per `period`.
    pub count: u64,
    /// The period (redis-cell takes it in whole seconds).
    pub period: Duration,
}

/// Parameters of the window algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowParams {
    /// Units admitted per window.
    pub max: u64,
    /// Window length in nanoseconds.
    pub window_ns: u64,
}

/// Parameters of the concurrency limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConcurrencyParams {
    /// Units that may be in flight at once.
    pub max_in_flight: u64,
    /// How long a permit lives if never released (a crashed holder), in nanoseconds.
    pub lease_ns: u64,
}
