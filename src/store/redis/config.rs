//! What a connected Redis store was configured with ([`Config`]), and where
//! its scripts take `now` from ([`TimeSource`]). A leaf: the builder, the
//! preflight checks and every store operation read it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{breaker, params, HashTag};
use crate::clock::Clock;
use crate::store::StoreError;

/// Where the scripts take `now` from.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum TimeSource {
    /// The Redis server's `TIME` (default). Use this in production: every app
    /// instance sees one clock, however skewed their own clocks are.
    #[default]
    Server,
    /// A clock in this process, sent with every call (truncated to whole
    /// microseconds). For deterministic tests with a
    /// [`ManualClock`](crate::clock::ManualClock): several instances with
    /// skewed clocks would disagree, and the server still expires keys on its
    /// own clock (see [`RedisStoreBuilder::ttl_padding`](super::RedisStoreBuilder::ttl_padding)).
    Client(Arc<dyn Clock>),
}

impl TimeSource {
    /// [`TimeSource::Client`] from any clock.
    pub fn client(clock: impl Clock) -> Self {
        TimeSource::Client(Arc::new(clock))
    }
}

impl fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeSource::Server => "Server",
            TimeSource::Client(_) => "Client",
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchConfig {
    pub(crate) enabled: bool,
    pub(crate) max: usize,
    pub(crate) queue: usize,
    pub(crate) in_flight: usize,
}

#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) time: TimeSource,
    pub(crate) tag: HashTag,
    pub(crate) ttl_padding_ms: u64,
    pub(crate) cluster: bool,
    pub(crate) batch: BatchConfig,
    pub(crate) deny_cache: usize,
    /// Stops sending while a single server is unresponsive (no offline queue).
    pub(crate) breaker: breaker::Breaker,
    /// Whether an `allkeys-*` eviction policy fails the connect.
    pub(crate) require_safe_eviction: bool,
    /// The server's `maxmemory-policy` seen at connect.
    pub(crate) eviction_policy: Option<String>,
}

impl Config {
    /// `now` for the scripts: empty for server time, else µs.
    pub(crate) fn now_arg(&self) -> Result<String, StoreError> {
        match &self.time {
            TimeSource::Server => Ok(String::new()),
            TimeSource::Client(clock) => {
                let us = clock.now_ns() / 1000;
                if us >= params::MAX_NOW_US {
                    return Err(StoreError::Unsupported(
                        "a client clock at or beyond 2^52 µs on Redis",
                    ));
                }
                Ok(us.to_string())
            }
        }
    }
}
