//! Redis and Redis Cluster stores: one set of limits shared by every app
//! instance (feature `redis`).
//!
//! * **Atomic, one round trip.** Every check is one `EVALSHA` of a Lua script
//!   (loaded at connect, reloaded by redis-rs on `NOSCRIPT`) that decides every
//!   rule and commits them only if all allow: [`Store::check_all`] is
//!   all-or-nothing.
//! * **Server time.** Scripts read the server's `TIME` in microseconds (Lua
//!   numbers are doubles: nanoseconds since the epoch would not be exact), so
//!   app servers with skewed clocks agree. [`TimeSource::Client`] exists for
//!   deterministic tests only. Policies must be whole microseconds, and their
//!   products must stay far below 2^53; others are refused with
//!   [`StoreError::Unsupported`] rather than rounded.
//! * **Same decisions as the memory store.** For GCRA and the two window
//!   counters the script returns the state it decided on and the decision is
//!   rendered by the very functions of [`crate::algorithm`]; the sliding log
//!   and concurrency scripts compute theirs in µs (differences of timestamps,
//!   exact). The test suite compares the stores decision by decision.
//! * **Every key expires** (`PEXPIRE`, rounded up to the millisecond) as soon
//!   as it is back to a fresh state: cold users vanish by themselves.
//! * **Keys**: `<prefix>:{<tag>}:<algorithm>:<key>`, safe whatever bytes the key
//!   holds; see [`HashTag`] for the cluster slot and multi-rule checks.
//! * **Failures are typed** ([`StoreError::Connection`], [`StoreError::Timeout`],
//!   [`StoreError::Script`], [`StoreError::Cluster`], [`StoreError::Protocol`]);
//!   every call is bounded by the store timeout, the connection reconnects by
//!   itself and nothing queues while Redis is down.
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
//! assert_eq!(posts.check("laoqian").await?.to_cell_reply(), [0, 16, 15, -1, 2]);
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
//! A check of rules that all use one algorithm runs a script holding only
//! that algorithm (less Lua to run per call); mixed rules run the full one.

mod cell;
mod error;
mod keys;
mod params;
mod reply;

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, Script, Value};

pub use cell::CellStore;
pub use keys::{HashTag, MAX_RAW_KEY};

use self::error::timed;
use self::params::Params;
use self::reply::RuleReply;
use crate::clock::Clock;
use crate::decision::{Decision, PermitId};
use crate::policy::Policy;
use crate::store::{Rule, Store, StoreError};

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "throttle";
/// Default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);

macro_rules! script {
    ($($file:literal),*) => {
        LazyLock::new(|| Script::new(concat!(include_str!("scripts/common.lua"),
            $(include_str!(concat!("scripts/", $file))),*)))
    };
}

/// Every algorithm: for checks mixing algorithms.
static CHECK: LazyLock<Script> = script!(
    "gcra.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_log.lua",
    "concurrency.lua",
    "check.lua"
);
static CHECK_G: LazyLock<Script> = script!("gcra.lua", "check.lua");
static CHECK_F: LazyLock<Script> = script!("fixed_window.lua", "check.lua");
static CHECK_S: LazyLock<Script> = script!("sliding_window.lua", "check.lua");
static CHECK_L: LazyLock<Script> = script!("sliding_log.lua", "check.lua");
static CHECK_C: LazyLock<Script> = script!("concurrency.lua", "check.lua");
static REFUND: LazyLock<Script> = script!(
    "gcra.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_log.lua",
    "concurrency.lua",
    "refund.lua"
);
static RELEASE: LazyLock<Script> = script!("concurrency.lua", "release.lua");

/// The smallest check script that holds every algorithm of `rules`.
fn check_script(rules: &[Rule<'_>]) -> &'static Script {
    let code = rules.first().map_or("", |r| keys::code(r.policy));
    if rules.iter().any(|r| keys::code(r.policy) != code) {
        return &CHECK;
    }
    match code {
        "g" => &CHECK_G,
        "f" => &CHECK_F,
        "s" => &CHECK_S,
        "l" => &CHECK_L,
        "c" => &CHECK_C,
        _ => &CHECK,
    }
}

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
    /// own clock (see [`RedisStoreBuilder::ttl_padding`]).
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

#[derive(Debug)]
struct Config {
    prefix: String,
    timeout: Duration,
    time: TimeSource,
    tag: HashTag,
    ttl_padding_ms: u64,
    cluster: bool,
}

/// Configures a [`RedisStore`] or [`RedisClusterStore`].
#[derive(Debug)]
pub struct RedisStoreBuilder {
    prefix: String,
    timeout: Duration,
    time: TimeSource,
    tag: HashTag,
    ttl_padding: Duration,
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
        self.timeout = timeout.max(Duration::from_millis(1));
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

    /// Extra lifetime added to every key's TTL (default zero: keys live
    /// exactly as long as their state matters, rounded up to the ms). Only
    /// for a [`TimeSource::Client`] clock that runs slower than real time, as
    /// a frozen test clock does; keep it zero in production.
    pub fn ttl_padding(mut self, padding: Duration) -> Self {
        self.ttl_padding = padding;
        self
    }

    fn config(self, cluster: bool) -> Result<Config, StoreError> {
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
        })
    }

    /// Connects to one Redis server (`redis://host:port/db`) through a
    /// [`ConnectionManager`] that reconnects by itself. Connection and
    /// response timeouts are the store timeout and reconnection retries are
    /// few, so calls fail fast (per the layer's fail mode) while Redis is down
    /// instead of queueing.
    pub async fn connect(self, info: impl IntoConnectionInfo) -> Result<RedisStore, StoreError> {
        let t = self.timeout;
        let cfg = self.config(false)?;
        let client = redis::Client::open(info).map_err(|e| error::map(e, t))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(t))
            .set_response_timeout(Some(t))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(t.max(Duration::from_millis(100)));
        let conn = timed(t, ConnectionManager::new_with_config(client, config)).await?;
        let store = RedisStore::with_config(conn, cfg);
        store.load_scripts().await?;
        Ok(store)
    }

    /// Connects to a Redis Cluster through any of its nodes. Multi-rule
    /// checks need keys with one hash tag: see [`HashTag`].
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<RedisClusterStore, StoreError> {
        let t = self.timeout;
        let cfg = self.config(true)?;
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(t)
            .response_timeout(t)
            .retries(2)
            .build()
            .map_err(|e| error::map(e, t))?;
        let conn = timed(t, client.get_async_connection()).await?;
        let store = RedisStore::with_config(conn, cfg);
        store.load_scripts().await?;
        Ok(store)
    }

    /// A store over a connection you made yourself (any redis-rs async
    /// connection). `cluster` enforces one hash tag per multi-rule check.
    pub fn build<C>(self, conn: C, cluster: bool) -> Result<RedisStore<C>, StoreError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        Ok(RedisStore::with_config(conn, self.config(cluster)?))
    }
}

/// Permit ids: a random per-store base plus a counter, so instances sharing
/// a key never hand out the same id.
#[derive(Debug)]
struct Permits {
    base: u64,
    next: AtomicU64,
}

impl Permits {
    fn new() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        Permits {
            base: h.finish(),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> PermitId {
        PermitId(
            self.base
                .wrapping_add(self.next.fetch_add(1, Ordering::Relaxed)),
        )
    }
}

/// A [`Store`] on Redis: see the [module docs](self).
///
/// Clones share the connection.
pub struct RedisStore<C = ConnectionManager> {
    conn: C,
    cfg: Arc<Config>,
    permits: Arc<Permits>,
}

/// A [`RedisStore`] on a Redis Cluster (same scripts; each touches one slot).
pub type RedisClusterStore = RedisStore<ClusterConnection>;

impl<C: Clone> Clone for RedisStore<C> {
    fn clone(&self) -> Self {
        RedisStore {
            conn: self.conn.clone(),
            cfg: self.cfg.clone(),
            permits: self.permits.clone(),
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
    /// Configures a store: prefix, timeout, time source, hash tags.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            time: TimeSource::Server,
            tag: HashTag::PerKey,
            ttl_padding: Duration::ZERO,
        }
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

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn with_config(conn: C, cfg: Config) -> Self {
        RedisStore {
            conn,
            cfg: Arc::new(cfg),
            permits: Arc::new(Permits::new()),
        }
    }

    /// Loads the scripts (`SCRIPT LOAD`; on a cluster, on every master), so
    /// the first checks need no reload round trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let scripts = [
            &CHECK, &CHECK_G, &CHECK_F, &CHECK_S, &CHECK_L, &CHECK_C, &REFUND, &RELEASE,
        ];
        for script in scripts.map(|s| &**s) {
            timed(self.cfg.timeout, script.load_async(&mut conn)).await?;
        }
        Ok(())
    }

    /// The underlying connection.
    pub fn connection(&self) -> &C {
        &self.conn
    }

    /// The Redis key holding `key`'s state under `policy`: for operations
    /// (inspect with `PTTL`, `CLUSTER KEYSLOT`) and tests.
    pub fn redis_key(&self, key: &[u8], policy: &Policy) -> Vec<u8> {
        keys::redis_key(&self.cfg.prefix, self.cfg.tag.tag(key), policy, key)
    }

    /// `now` for the scripts: empty for server time, else µs.
    fn now_arg(&self) -> Result<String, StoreError> {
        match &self.cfg.time {
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

    async fn eval(&self, inv: &redis::ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        timed(self.cfg.timeout, inv.invoke_async::<Value>(&mut conn)).await
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn check(&self, rule: Rule<'_>) -> Result<Decision, StoreError> {
        let mut d = self.check_all(&[rule]).await?;
        d.pop()
            .ok_or_else(|| StoreError::Protocol("no decision in the reply".into()))
    }

    async fn check_all(&self, rules: &[Rule<'_>]) -> Result<Vec<Decision>, StoreError> {
        if rules.is_empty() {
            return Ok(Vec::new());
        }
        for (i, a) in rules.iter().enumerate() {
            if rules[..i].iter().any(|b| b.key == a.key) {
                return Err(StoreError::InvalidRequest("two rules name the same key"));
            }
        }
        let mut inv = check_script(rules).prepare_invoke();
        inv.arg(self.now_arg()?).arg(self.cfg.ttl_padding_ms);
        let mut replies = Vec::with_capacity(rules.len());
        let first_tag = self.cfg.tag.tag(rules[0].key);
        for rule in rules {
            let p = Params::of(rule.policy)?;
            let tag = self.cfg.tag.tag(rule.key);
            if self.cfg.cluster && tag != first_tag {
                return Err(StoreError::InvalidRequest(
                    "rules of one check must share a hash tag on a cluster (see HashTag)",
                ));
            }
            let permit = rule.policy.is_concurrency().then(|| self.permits.next());
            inv.key(keys::redis_key(
                &self.cfg.prefix,
                tag,
                rule.policy,
                rule.key,
            ))
            .arg(p.code)
            .arg(p.p1)
            .arg(p.p2)
            .arg(p.script_cost(rule.cost))
            .arg(permit.map_or_else(String::new, |p| p.0.to_string()));
            replies.push(RuleReply {
                policy: rule.policy,
                cost: rule.cost,
                permit,
            });
        }
        let v = self.eval(&inv).await?;
        reply::decisions(&replies, &v)
    }

    async fn refund(&self, key: &[u8], policy: &Policy, amount: u64) -> Result<(), StoreError> {
        let p = Params::of(policy)?;
        if amount == 0 {
            return Ok(());
        }
        let mut inv = REFUND.prepare_invoke();
        inv.key(self.redis_key(key, policy))
            .arg(self.now_arg()?)
            .arg(self.cfg.ttl_padding_ms)
            .arg(p.code)
            .arg(p.p1)
            .arg(p.p2)
            .arg(p.script_amount(amount));
        self.eval(&inv).await.map(drop)
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut del = redis::cmd("DEL");
        del.arg(self.redis_key(key, policy));
        timed(self.cfg.timeout, del.query_async::<Value>(&mut conn))
            .await
            .map(drop)
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        if !policy.is_concurrency() {
            return Ok(());
        }
        let mut inv = RELEASE.prepare_invoke();
        inv.key(self.redis_key(key, policy))
            .arg(self.now_arg()?)
            .arg(self.cfg.ttl_padding_ms)
            .arg(permit.0.to_string());
        self.eval(&inv).await.map(drop)
    }
}
