//! Configuring a [`RedisStore`](super::RedisStore): prefix, timeout, time
//! source, hash tags, batching, the denial cache. Connecting is in
//! `connect.rs`.

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::config::{BatchConfig, Config, TimeSource};
use super::{breaker, HashTag, RedisStore};
use super::{
    DEFAULT_BATCHES_IN_FLIGHT, DEFAULT_BATCH_QUEUE, DEFAULT_DENY_CACHE, DEFAULT_MAX_BATCH,
    DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};
use crate::store::StoreError;

/// Configures a [`RedisStore`] or [`RedisClusterStore`](super::RedisClusterStore).
#[derive(Clone, Debug)]
#[must_use = "builders do nothing until used"]
pub struct RedisStoreBuilder {
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) time: TimeSource,
    pub(crate) tag: HashTag,
    pub(crate) ttl_padding: Duration,
    pub(crate) batch: BatchConfig,
    pub(crate) deny_cache: usize,
    pub(crate) require_safe_eviction: bool,
    #[cfg(feature = "tls")]
    pub(crate) tls: super::tls::Tls,
    /// The master's credentials behind Sentinel.
    pub(crate) sentinel_auth: Option<MasterAuth>,
    pub(crate) sentinel_poll: Duration,
}

/// A username and password, never printed.
#[derive(Clone)]
pub(crate) struct MasterAuth(pub(crate) Option<String>, pub(crate) String);

impl fmt::Debug for MasterAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterAuth(<redacted>)")
    }
}

impl Default for RedisStoreBuilder {
    /// The defaults, each a constant of this module: [`DEFAULT_PREFIX`],
    /// [`DEFAULT_TIMEOUT`], [`TimeSource::Server`], [`HashTag::PerKey`], no
    /// TTL padding, batching on ([`DEFAULT_MAX_BATCH`],
    /// [`DEFAULT_BATCH_QUEUE`], [`DEFAULT_BATCHES_IN_FLIGHT`]), a denial cache
    /// of [`DEFAULT_DENY_CACHE`] keys, eviction checked with a warning only.
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            time: TimeSource::Server,
            tag: HashTag::PerKey,
            ttl_padding: Duration::ZERO,
            batch: BatchConfig {
                enabled: true,
                max: DEFAULT_MAX_BATCH,
                queue: DEFAULT_BATCH_QUEUE,
                in_flight: DEFAULT_BATCHES_IN_FLIGHT,
            },
            deny_cache: DEFAULT_DENY_CACHE,
            require_safe_eviction: false,
            #[cfg(feature = "tls")]
            tls: Default::default(),
            sentinel_auth: None,
            sentinel_poll: Duration::from_secs(1),
        }
    }
}

impl RedisStoreBuilder {
    /// Prefix of every key (default [`DEFAULT_PREFIX`]); no `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on every call, connecting included (default [`DEFAULT_TIMEOUT`]);
    /// a call that takes longer fails with [`StoreError::Timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(super::MIN_TIMEOUT);
        self
    }

    /// Where `now` comes from (default [`TimeSource::Server`]).
    pub fn time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// How keys are assigned hash tags (default [`HashTag::PerKey`]).
    pub fn hash_tag(mut self, tag: HashTag) -> Self {
        self.tag = tag;
        self
    }

    /// Extra lifetime added to every key's TTL (default zero: keys live as
    /// long as their state matters, rounded up to the ms, GCRA keys to the
    /// next whole second). Only for a [`TimeSource::Client`] clock that runs
    /// slower than real time, as a frozen test clock does: it must cover the
    /// real time that passes while that clock stands still, since a key's
    /// expiry was last set (for GCRA, its last `PEXPIRE`, not its last
    /// write). Keep it zero in production.
    pub fn ttl_padding(mut self, padding: Duration) -> Self {
        self.ttl_padding = padding;
        self
    }

    /// Whether checks waiting at the same moment are sent together, as one
    /// script call that evaluates them in order (default on; see the
    /// [module docs](super#batching)). Off, every check is its own `EVALSHA`.
    pub fn batching(mut self, on: bool) -> Self {
        self.batch.enabled = on;
        self
    }

    /// Most checks in one script call (default [`DEFAULT_MAX_BATCH`], at
    /// least 1): bounds how long one call holds Redis's single thread.
    pub fn max_batch(mut self, checks: usize) -> Self {
        self.batch.max = checks.max(1);
        self
    }

    /// Capacity of the queue of checks waiting to be batched (default
    /// [`DEFAULT_BATCH_QUEUE`], at least 1). When it is full, callers wait
    /// for room (backpressure) within their store timeout, then fail with
    /// [`StoreError::Timeout`]: nothing queues without bound.
    pub fn batch_queue(mut self, checks: usize) -> Self {
        self.batch.queue = checks.max(1);
        self
    }

    /// Most batches on the connection at once (default
    /// [`DEFAULT_BATCHES_IN_FLIGHT`], at least 1): while that many are out,
    /// new checks gather into the next batch. With more than one, a batch
    /// goes out while another is on the wire only once it holds its share of
    /// the checks outstanding, so that Redis evaluates one batch while the
    /// client answers the other; an idle connection always sends at once.
    pub fn batches_in_flight(mut self, batches: usize) -> Self {
        self.batch.in_flight = batches.max(1);
        self
    }

    /// Capacity, in keys, of the local denial cache (default
    /// [`DEFAULT_DENY_CACHE`]; 0 turns it off): a denied hot key is answered
    /// in process until Redis would admit it again, never admitting what
    /// Redis would deny (see the [module docs](super#the-denial-cache)).
    pub fn deny_cache(mut self, keys: usize) -> Self {
        self.deny_cache = keys;
        self
    }

    /// Whether connecting fails when the server's `maxmemory-policy` is
    /// `allkeys-lru`, `allkeys-lfu` or `allkeys-random` (default off: a
    /// `tracing` warning). Those policies evict keys in use, and an evicted
    /// limiter key is a reset quota; `noeviction` or a `volatile-*` policy
    /// never evicts them early, since every key this crate writes has a TTL.
    /// Not checked when the server refuses `CONFIG GET` (ACL, managed
    /// services): see [`RedisStore::server_eviction_policy`].
    pub fn require_safe_eviction(mut self, on: bool) -> Self {
        self.require_safe_eviction = on;
        self
    }

    pub(crate) fn config(self, cluster: bool) -> Result<Config, StoreError> {
        if self.prefix.contains(['{', '}']) {
            return Err(StoreError::InvalidRequest(
                "the Redis key prefix may not contain `{` or `}`",
            ));
        }
        Ok(Config {
            prefix: self.prefix,
            timeout: self.timeout,
            time: self.time,
            tag: self.tag,
            ttl_padding_ms: u64::try_from(self.ttl_padding.as_millis()).unwrap_or(u64::MAX),
            cluster,
            batch: self.batch,
            deny_cache: self.deny_cache,
            breaker: breaker::Breaker::default(),
            require_safe_eviction: self.require_safe_eviction,
            eviction_policy: None,
        })
    }

    /// A store over a connection you made yourself (any redis-rs async
    /// connection). `cluster` enforces one hash tag per multi-rule check.
    /// Runs no connect-time checks.
    pub fn build<C>(self, conn: C, cluster: bool) -> Result<RedisStore<C>, StoreError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Ok(RedisStore::with_config(conn, self.config(cluster)?))
    }
}
