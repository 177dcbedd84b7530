//! Redis and Redis Cluster stores: one set of limits shared by every app
//! instance (feature `redis`).
//!
//! * **Atomic, one round trip.** Every check is evaluated by a Lua script
//!   (loaded at connect, reloaded on `NOSCRIPT`) that decides every rule and
//!   commits them only if all allow: [`Store::check_all`] is all-or-nothing.
//!   Checks waiting at the same moment share one `EVALSHA` (see
//!   [Batching](#batching)).
//! * **Server time.** Scripts read the server's `TIME` in microseconds (Lua
//!   numbers are doubles: nanoseconds since the epoch would not be exact), so
//!   app servers with skewed clocks agree. [`TimeSource::Client`] exists for
//!   deterministic tests only. Durations that are not whole microseconds
//!   (a rate of 3/s, a window of 1.5 µs or 1/3 s, a lease of 2.5 ms) run
//!   exactly too: the scripts keep them as (µs, ns) pairs and divide by them
//!   with exact long division, so decisions match the memory store at the
//!   server clock's µs, for windows from 1 ns (their indices pass 2^53 and
//!   are kept as exact digit pairs) to 2^50 µs (35 years), and sliding
//!   windows compare their scaled counts in exact limbs whatever their size.
//!   Durations above 2^50 µs, limits above 2^50 and GCRA products past
//!   2^50 µs are refused with [`StoreError::Unsupported`] rather than
//!   rounded.
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
mod deny;
mod error;
mod keys;
mod params;
mod preflight;
mod reply;
mod sentinel;
#[cfg(feature = "tls")]
mod tls;
mod validate;

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, Script, Value};
use tokio::sync::{mpsc, oneshot};

pub use builder::{RedisStoreBuilder, TimeSource};
pub use cell::CellStore;
pub use keys::{HashTag, MAX_RAW_KEY};
pub use sentinel::{RedisSentinelStore, SentinelConnection};

use self::batch::{Job, JobRule, Outcome};
use self::builder::{BatchConfig, Config};
use self::deny::DenyCache;
use self::error::timed;
use self::params::Params;
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, Policy};
use crate::store::{Rule, RuleSpec, Store, StoreError};

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "throttle";
/// Default bound on every store call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(200);
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

macro_rules! script {
    ($($file:literal),*) => {
        LazyLock::new(|| Script::new(concat!(include_str!("scripts/common.lua"),
            $(include_str!(concat!("scripts/", $file))),*)))
    };
}

/// Every algorithm: for checks mixing algorithms.
static CHECK: LazyLock<Script> = script!(
    "gcra.lua",
    "gcra_ns.lua",
    "window.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_log.lua",
    "concurrency.lua",
    "check.lua"
);
static CHECK_G: LazyLock<Script> = script!("gcra.lua", "gcra_ns.lua", "check.lua");
/// Single-rule GCRA checks under one policy and cost: see `gcra_batch.lua`.
static GCRA_BATCH: LazyLock<Script> = script!("gcra.lua", "gcra_batch.lua");
/// The same at nanosecond precision: see `gcra_ns_batch.lua`.
static GCRA_NS_BATCH: LazyLock<Script> = script!("gcra.lua", "gcra_ns.lua", "gcra_ns_batch.lua");
static CHECK_F: LazyLock<Script> = script!("window.lua", "fixed_window.lua", "check.lua");
static CHECK_S: LazyLock<Script> = script!("window.lua", "sliding_window.lua", "check.lua");
static CHECK_L: LazyLock<Script> = script!("sliding_log.lua", "check.lua");
static CHECK_C: LazyLock<Script> = script!("concurrency.lua", "check.lua");
static REFUND: LazyLock<Script> = script!(
    "gcra.lua",
    "gcra_ns.lua",
    "window.lua",
    "fixed_window.lua",
    "sliding_window.lua",
    "sliding_log.lua",
    "concurrency.lua",
    "refund.lua"
);
static RELEASE: LazyLock<Script> = script!("concurrency.lua", "release.lua");

/// The smallest check script that holds every algorithm of `policies`.
fn check_script<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> &'static Script {
    let mut policies = policies.into_iter();
    let code = policies.next().map_or("", keys::code);
    if policies.any(|p| keys::code(p) != code) {
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
    /// Configures a store: prefix, timeout, time source, hash tags.
    pub fn builder() -> RedisStoreBuilder {
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
            deny: Arc::new(DenyCache::new(cfg.deny_cache, &cfg.time)),
            cfg: Arc::new(cfg),
            permits: Arc::new(Permits::new()),
            batcher: Arc::new(OnceLock::new()),
            namespaces: Default::default(),
        }
    }

    /// Loads the scripts (`SCRIPT LOAD`; on a cluster, on every master), so
    /// the first checks need no reload round trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let scripts = [
            &CHECK,
            &CHECK_G,
            &GCRA_BATCH,
            &GCRA_NS_BATCH,
            &CHECK_F,
            &CHECK_S,
            &CHECK_L,
            &CHECK_C,
            &REFUND,
            &RELEASE,
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
        self.cfg.now_arg()
    }

    /// Runs `call`, which relaxes `key`'s state, dropping the key from the
    /// denial cache before and after (so a check reply that raced the call
    /// cannot bring back the state from before it).
    async fn invalidating<T>(
        &self,
        key: &[u8],
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.deny.invalidate(key);
        let r = call.await;
        self.deny.invalidate(key);
        r
    }

    /// Keys held by the local denial cache.
    pub fn deny_cache_len(&self) -> usize {
        self.deny.len()
    }

    /// Sends one check, through the batcher or alone.
    async fn run_check(&self, rules: Vec<JobRule>, slot: u16) -> Result<Outcome, StoreError> {
        // A check that may be granted a lease runs in a task of its own, so
        // that its reply is seen even if the caller is gone (see abandoned.rs).
        if !self.cfg.batch.enabled && !abandoned::holds_permits(&rules) {
            let sent = std::sync::atomic::AtomicBool::new(false);
            let (now_ns, mut r) =
                batch::eval_checks(&self.conn, &self.cfg, &[&rules], &sent).await?;
            let checked = r
                .pop()
                .ok_or_else(|| StoreError::Protocol("no check in the reply".into()))??;
            return Ok(Outcome {
                checked,
                now_ns,
                leases: None,
            });
        }
        let (reply, answer) = oneshot::channel();
        let job = Job { rules, slot, reply };
        let stopped = || StoreError::Connection("the Redis batcher task has stopped".into());
        let call = async {
            if self.cfg.batch.enabled {
                let tx = self
                    .batcher
                    .get_or_init(|| batcher::spawn(self.conn.clone(), self.cfg.clone()));
                tx.send(job).await.map_err(|_| stopped())?;
            } else {
                let (conn, cfg) = (self.conn.clone(), self.cfg.clone());
                tokio::spawn(batch::execute(conn, cfg, vec![job]));
            }
            answer.await.map_err(|_| stopped())?
        };
        match tokio::time::timeout(self.cfg.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Timeout(self.cfg.timeout)),
        }
    }

    async fn eval(&self, inv: &redis::ScriptInvocation<'_>) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        let call = timed(self.cfg.timeout, inv.invoke_async::<Value>(&mut conn));
        self.cfg.breaker.guard(&self.conn, &self.cfg, call).await
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn namespaces(&self) -> Option<&crate::store::Namespaces> {
        Some(&self.namespaces)
    }

    /// Refuses policies the scripts cannot evaluate exactly (sub-microsecond
    /// times, products reaching 2^50 µs, sliding logs above 10,000) and, on a
    /// cluster, rules whose keys cannot share a hash slot under the store's
    /// [`HashTag`].
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        validate::rules(rules, &self.cfg.tag, self.cfg.cluster)
    }

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
        let first_tag = self.cfg.tag.tag(rules[0].key);
        let mut job = Vec::with_capacity(rules.len());
        for rule in rules {
            let params = Params::of(rule.policy)?;
            let tag = self.cfg.tag.tag(rule.key);
            if self.cfg.cluster && tag != first_tag {
                return Err(StoreError::InvalidRequest(
                    "rules of one check must share a hash tag on a cluster (see HashTag)",
                ));
            }
            job.push(JobRule {
                key: keys::redis_key(&self.cfg.prefix, tag, rule.policy, rule.key),
                policy: *rule.policy,
                params,
                cost: rule.cost,
                permit: rule.policy.is_concurrency().then(|| self.permits.next()),
            });
        }
        let slot = if self.cfg.cluster {
            batch::slot_of(&first_tag)
        } else {
            0
        };
        // A single rule may be answered by, or teach, the denial cache.
        let cached = (rules.len() == 1 && self.deny.enabled()).then(|| {
            let r = &job[0];
            (r.key.clone(), r.cost, self.deny.ticket())
        });
        if let Some((key, cost, _)) = &cached {
            if let Some(d) = self.deny.lookup(key, rules[0].policy, *cost) {
                return Ok(vec![d]);
            }
        }
        let Outcome {
            checked: (decisions, state),
            now_ns,
            leases,
        } = self.run_check(job, slot).await?;
        // From here to the caller there is no await: the decisions, and the
        // permits in them, are the caller's now.
        if let Some(leases) = leases {
            leases.disarm();
        }
        if let (Some((key, cost, ticket)), Some(d)) = (cached, decisions.first()) {
            self.deny.offer(ticket, &key, cost, d, state, now_ns);
        }
        Ok(decisions)
    }

    async fn refund(&self, key: &[u8], policy: &Policy, amount: u64) -> Result<(), StoreError> {
        let p = Params::of(policy)?;
        if amount == 0 {
            return Ok(());
        }
        let rk = self.redis_key(key, policy);
        let mut inv = REFUND.prepare_invoke();
        inv.key(&rk[..])
            .arg(self.now_arg()?)
            .arg(self.cfg.ttl_padding_ms)
            .arg(p.code)
            .arg(p.p1)
            .arg(p.p2)
            .arg(p.script_amount(amount));
        self.invalidating(&rk, self.eval(&inv)).await.map(drop)
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let rk = self.redis_key(key, policy);
        let mut del = redis::cmd("DEL");
        del.arg(&rk[..]);
        let call = timed(self.cfg.timeout, del.query_async::<Value>(&mut conn));
        self.invalidating(&rk, call).await.map(drop)
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
        let Algorithm::Concurrency(p) = policy.algorithm() else {
            return Ok(());
        };
        // In a task of its own, retried there after a failure that may be
        // passing (a stall, a broken connection): neither a dropped caller
        // nor a fault leaves the permit held until its lease runs out.
        let lease = abandoned::Abandoned::new(
            self.redis_key(key, policy),
            permit,
            Duration::from_nanos(p.lease_ns),
        );
        let (tx, first) = oneshot::channel();
        tokio::spawn(abandoned::release_reporting(
            self.conn.clone(),
            self.cfg.clone(),
            lease,
            tx,
        ));
        first.await.unwrap_or_else(|_| {
            Err(StoreError::Connection(
                "the release task has stopped".into(),
            ))
        })
    }
}
