//! Redis and Redis Cluster stores: one set of limits shared by every app
//! instance (feature `redis`).
//!
//! * **Atomic, one round trip.** Every check is evaluated by a Lua script
//!   (loaded at connect, reloaded on `NOSCRIPT`) that decides every rule and
//!   commits them only if all allow: [`Store::check_all`](crate::Store::check_all) is all-or-nothing.
//!   Checks waiting at the same moment share one `EVALSHA` (see
//!   [Batching](#batching)).
//! * **Server time.** Scripts read the server's `TIME` in microseconds, so
//!   app servers with skewed clocks agree. [`TimeSource::Client`] exists for
//!   deterministic tests only. GCRA runs in nanoseconds end to end: T and tau
//!   travel in ns and a tat is stored in ns modulo 1000·2^43 ns (Lua numbers
//!   are doubles, and ns since the epoch would not be exact), read as its
//!   offset from now; so GCRA tolerances (interval × limit) up to 50 days
//!   run, and longer ones are refused. Windows, logs and leases that are not
//!   whole microseconds (a window of 1.5 µs or 1/3 s, a lease of 2.5 ms) run
//!   exactly too: the scripts keep them as (µs, ns) pairs and divide by them
//!   with exact long division, so decisions match the memory store at the
//!   server clock's µs, for windows from 1 ns (their indices pass 2^53 and
//!   are kept as exact digit pairs) to 2^50 µs (35 years), and sliding
//!   windows compare their scaled counts in exact limbs whatever their size.
//!   GCRA tolerances of 1000·2^42 ns (50 days) or more, other durations
//!   above 2^50 µs and limits above 2^50 are refused with
//!   [`StoreError::Unsupported`] rather than rounded, when the layer or
//!   limiter is built.
//! * **Same decisions as the memory store.** For GCRA and the two window
//!   counters the script returns the state it decided on and the decision is
//!   rendered by the very functions of [`crate::algorithm`]; the sliding log
//!   and concurrency scripts compute theirs from whole-µs timestamps
//!   (differences of timestamps, exact). The test suite compares the stores decision by decision.
//! * **Every key expires** as soon as it is back to a fresh state (rounded up
//!   to the millisecond; GCRA keys to the next whole second, see Batching):
//!   cold users vanish by themselves.
//! * **Keys**: `<prefix>:{<tag>}:<algorithm>:<key>`, safe whatever bytes the key
//!   holds; see [`HashTag`] for the cluster slot and multi-rule checks.
//! * **Failures are typed** ([`StoreError::Connection`], [`StoreError::Timeout`],
//!   [`StoreError::Unavailable`], [`StoreError::Cluster`], [`StoreError::Script`],
//!   [`StoreError::Protocol`]); every call is bounded by the store timeout, the
//!   connection reconnects by itself and nothing queues while Redis is down.
//!   See [Outages and defects](#outages-and-defects).
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_throttle::store::redis::RedisStore;
//! use tower_throttle::{Limiter, Policy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder()
//!     .prefix("myapp")
//!     .timeout(Duration::from_millis(50))
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//! let posts = Limiter::new(store, Policy::cell(15, 30, Duration::from_secs(60))?);
//! assert_eq!(posts.check("user-42").await?.to_cell_reply(), [0, 16, 15, -1, 2]);
//! # Ok(())
//! # }
//! ```
//!
//! Sliding-log keys hold one ZSET member per admitted unit, `<µs>:<index>`
//! scored by its admission time (unique members: units of one instant are
//! numbered, never collapsed), so each check is O(log n); concurrency keys
//! hold one member per permit, `<seq>:<permit id>:<units>`, scored by the
//! lease's expiry.
//!
//! A script call whose rules all use one algorithm runs a script holding
//! only that algorithm (less Lua to run per call); mixed rules run the full
//! one.
//!
//! # Batching
//!
//! On by default ([`RedisStoreBuilder::batching`]). Each store has a batcher
//! task fed by a bounded queue ([`RedisStoreBuilder::batch_queue`]): callers
//! enqueue their check and wait for its answer; the batcher takes what is
//! queued (at most [`RedisStoreBuilder::max_batch`] checks) and sends it as
//! ONE `EVALSHA` that evaluates the checks **in order**, each exactly
//! as if it ran alone after the previous one (the same key twice sees the
//! first one's effect; a multi-rule check stays all-or-nothing; a check that
//! fails, e.g. on a key of another type, fails alone). On a cluster, one
//! call per hash slot. When the connection is idle a check goes out at once,
//! alone, so batching adds no round trip. While batches are on the wire (at
//! most [`RedisStoreBuilder::batches_in_flight`], 2 by default) the next
//! one goes once it holds its share of the checks outstanding: Redis
//! evaluates one batch while the client answers the other, and the per-call
//! costs of Redis and of the client are paid once per batch. A GCRA batch
//! reads all its keys with one `MGET` and writes each changed key once, with
//! an `INCRBY` of the change that keeps the key's TTL, and a `PEXPIRE` only
//! when the expiry must move: a GCRA key expires at its theoretical arrival
//! time rounded up to the next whole second, so a key admitted more often
//! than once a second moves its expiry once a second.
//!
//! * Every call stays bounded by the store timeout, queueing included. When
//!   the queue is full callers wait for room (backpressure) within that
//!   timeout, then fail with [`StoreError::Timeout`]: nothing queues without
//!   bound.
//! * A caller that gives up (its timeout, or its future dropped) while its
//!   check is still queued is never evaluated, so never charged. A check
//!   already sent may still be applied, as without batching.
//! * With [`TimeSource::Client`], a batch uses the clock's reading when it
//!   is sent.
//! * Within a batch, checks are evaluated in the order they were queued.
//!   Batches on the wire at the same time may be evaluated in either order
//!   (each is its own task; after Redis loses its script cache, each is
//!   reloaded and retried on its own): their checks were all waiting at
//!   once, so either order is one in which they could have arrived, and
//!   every check is decided against all those decided before it. Nothing is
//!   admitted beyond a limit; who gets the last unit among checks waiting at
//!   the same moment is not first come, first served (as with the memory
//!   store's threads).
//!
//! # Outages and defects
//!
//! A server that answers but cannot decide now fails the call with
//! [`StoreError::Unavailable`] naming the state ([`Outage`](crate::store::Outage)),
//! recognised by the reply's error code whether the server refused the
//! `EVALSHA` itself or a command the script ran. Outages, timeouts, broken
//! connections and cluster routing failures are
//! [`StoreError::is_unavailable`]: a [`FallbackStore`](crate::store::FallbackStore)
//! answers them, else the layer's [`FailMode`](crate::FailMode). A setup
//! to fix is a [`StoreError::Config`] naming the fix. A defect (of this
//! crate, or of what sits between it and the server) is a
//! [`StoreError::Script`] or [`StoreError::Protocol`]: returned (a fallback
//! would hide it) and logged at error level, once per distinct cause
//! rather than per request.
//!
//! ## Which server errors fall back
//!
//! Every error reply of Redis 7 and Valkey, by code:
//!
//! | Reply | Meaning | Class | What the store does |
//! |---|---|---|---|
//! | `OOM` | `maxmemory` reached, nothing to evict | outage | `Unavailable(OutOfMemory)` (sliding-log and concurrency checks are still decided: below) |
//! | `BUSY` | another client's script or function past the busy threshold (a script timeout), or a module command | outage | `Unavailable(Busy)`; trips the breaker |
//! | `LOADING` | loading its data set (a restart, a replica's sync) | outage | `Unavailable(Loading)`; trips the breaker |
//! | `READONLY` | a replica, or a master demoted by a failover | outage | `Unavailable(ReadOnly)`; a Sentinel store asks the sentinels and retries once |
//! | `MASTERDOWN` | a replica cut off from its master, `replica-serve-stale-data no` | outage | `Unavailable(MasterDown)`; trips the breaker |
//! | `MISCONF` | an RDB save failed under `stop-writes-on-bgsave-error yes` (the default; a full disk, a lost directory) or AOF writes fail: writes and `PING` refused until a save succeeds | outage | `Unavailable(PersistenceFailing)` |
//! | `NOREPLICAS` | fewer good replicas than `min-replicas-to-write`: writes refused | outage | `Unavailable(NoReplicas)` |
//! | `ERR max number of clients reached` | `maxclients` reached: a new connection (a connect, a reconnect) refused and closed | outage | `Unavailable(TooManyClients)`; redis-rs often meets it as a reset connection: `Connection` |
//! | `CLUSTERDOWN`, `TRYAGAIN` | slots not served; a multi-key call during a slot's migration | outage | `Unavailable(ClusterDown)`, `Unavailable(TryAgain)` |
//! | `MOVED`, `ASK` | the slot is served elsewhere | followed by the cluster client; outage when it gives up | `Cluster` |
//! | `NOSCRIPT` | the script cache flushed (a restart, `SCRIPT FLUSH`) | reloaded and retried once; outage if it persists | `Unavailable(ScriptsLost)` |
//! | `NOAUTH`, `ERR Protocol error: unauthenticated …` | the server wants credentials the URL lacks | setup at connect; after it (a restart with a password) outage **and** setup | `Config` at connect; then `Unavailable(AuthRequired)`, logged at error level with the fix at most once a minute |
//! | `WRONGPASS` | the URL's credentials refused | setup at connect; on a reconnect (a changed password) outage **and** setup | `Config` at connect; then `Unavailable(AuthRefused)`, logged likewise: the connection does not retry such a reconnect, so the fallback decides until the store is connected again |
//! | `NOPERM`, an ACL failure in a script | the ACL user may not run a command or touch a key | setup (an ACL is not tightened in passing) | `Config` naming the `+command` or `~<prefix>:*` to add |
//! | `DENIED` | protected mode refuses a connection from another host | setup | `Config` |
//! | `CROSSSLOT` | keys of two slots in one call | defect: a cluster store's multi-rule checks share one hash tag, refused before any traffic otherwise | `Script`, logged |
//! | `WRONGTYPE` | a key of another type | defect: the scripts look at a key's type first and repair foreign data ([`StoreError::ForeignData`]) | `Script`, logged |
//! | `EXECABORT`, `BUSYKEY`, `NOTBUSY`, `UNKILLABLE`, `UNBLOCKED`, `NOGROUP`, `BUSYGROUP`, `NOSUB`, `NOPROTO`, `IOERR`, other `ERR Protocol error` | replies to what the store never sends (`MULTI`, `RESTORE`, `SCRIPT KILL`, blocking, stream and pub/sub commands, `HELLO 3`, `MIGRATE`, malformed bytes) | defect | `Script`, logged |
//! | any other `ERR` (a Lua error, a command unknown to a proxy), a reply of the wrong shape | | defect | `Script`, `Protocol`, logged |
//! | no answer in time; a refused, reset or broken connection | | outage | `Timeout`, `Connection` |
//!
//! `BUSY`, `LOADING` and `MASTERDOWN` (the server refuses every command
//! until they pass) also trip the store's breaker, as a timeout does: calls
//! then fail at once with that error and one `PING` per store timeout asks
//! whether it is over, so a busy server is not sent every check. Under
//! `OOM` a sliding-log or concurrency check is still decided by Redis: its
//! script's first write is a `ZREMRANGEBYSCORE`, which Redis allows, and a
//! script that has written may write past `maxmemory`. `MISCONF` and
//! `NOREPLICAS` refuse that write too. Credentials refused after connect
//! are an outage rather than a setup error alone because every check fails
//! until someone acts: the fallback keeps limiting meanwhile, and the error
//! log says what to fix.
//!
//! # The denial cache
//!
//! On by default ([`RedisStoreBuilder::deny_cache`], a bounded number of
//! keys). When Redis denies a single-rule GCRA, fixed-window or
//! sliding-window check, the store keeps the state Redis sent with the
//! denial and answers the key's next checks in process, with the same pure
//! function, at an upper bound of the server's clock (the local monotonic
//! clock from the moment the check was sent), for as long as that says
//! "denied". A denial changes no state and these states only relax with
//! time, so a locally answered denial is one Redis would give too: the cache
//! never admits anything. This store's own refund, reset and release drop the
//! key's entry. What it cannot see is another instance relaxing the key
//! (its refund or reset): such a key stays denied here until its
//! `retry_after` at the latest. Sliding-log and concurrency checks are never
//! cached (their state is a log; a concurrency denial lifts whenever any
//! holder releases).

mod abandoned;
mod batch;
mod batcher;
mod breaker;
mod builder;
mod cell;
mod cell_builder;
mod config;
mod connect;
mod deny;
mod error;
mod eval;
mod keys;
mod lazy;
mod ops;
mod params;
mod preflight;
mod queued;
mod registry;
mod reply;
mod sentinel;
#[cfg(feature = "tls")]
mod tls;
mod validate;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::IntoConnectionInfo;
use tokio::sync::mpsc;

pub use builder::RedisStoreBuilder;
pub use cell::CellStore;
pub use cell_builder::CellStoreBuilder;
pub use config::TimeSource;
pub use keys::{HashTag, MAX_RAW_KEY};
pub use lazy::{LazyRedisClusterStore, LazyRedisSentinelStore, LazyRedisStore};
pub use sentinel::{RedisSentinelStore, SentinelConnection};

use self::batch::Job;
use self::config::Config;
use self::deny::DenyCache;
use self::ops::PermitIdSource;
use crate::store::StoreError;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "throttle";
/// Default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
/// The shortest store timeout a builder accepts (shorter ones are raised).
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// Default most checks sent in one script call when batching.
pub const DEFAULT_MAX_BATCH: usize = 128;
/// Default capacity of the batching queue (checks waiting to be sent).
pub const DEFAULT_BATCH_QUEUE: usize = 4096;
/// Default most batches on the connection at once: two, so that Redis works
/// on one while the client answers the other (see
/// [`RedisStoreBuilder::batches_in_flight`]).
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 2;
/// Default capacity of the local denial cache (keys).
pub const DEFAULT_DENY_CACHE: usize = 4096;

/// A [`Store`](crate::Store) on Redis: see the [module docs](self).
///
/// Clones share the connection.
pub struct RedisStore<C = ConnectionManager> {
    conn: C,
    cfg: Arc<Config>,
    permits: Arc<PermitIdSource>,
    /// The batcher's queue, started by the first batched check.
    batcher: Arc<OnceLock<mpsc::Sender<Job>>>,
    deny: Arc<DenyCache>,
    namespaces: crate::store::Namespaces,
}

/// A [`RedisStore`] on a Redis Cluster (same scripts; each touches one slot).
pub type RedisClusterStore = RedisStore<ClusterConnection>;

impl<C: Clone> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        RedisStore {
            conn: self.conn.clone(),
            cfg: self.cfg.clone(),
            permits: self.permits.clone(),
            batcher: self.batcher.clone(),
            deny: self.deny.clone(),
            namespaces: self.namespaces.clone(),
        }
    }
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Configures a store: prefix, timeout, time source, hash tags (the
    /// defaults are [`RedisStoreBuilder::default`]).
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects to one server with the defaults.
    pub async fn connect(info: impl IntoConnectionInfo) -> Result<RedisStore, StoreError> {
        Self::builder().connect(info).await
    }
}

impl RedisClusterStore {
    /// Connects to a cluster with the defaults.
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<RedisClusterStore, StoreError> {
        RedisStore::builder().connect_cluster(nodes).await
    }
}
