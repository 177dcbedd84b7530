//! Upstream's counters on Redis (`RLS_REDIS_KEYS=upstream`, the default):
//! a fixed window without the extension counts under the key upstream
//! builds, with upstream's commands, so envoyproxy/ratelimit pods and these
//! on one Redis count each request once (a rolling migration).
//!
//! What upstream does (`src/redis/fixed_cache_impl.go`,
//! `src/redis/driver_impl.go` at f2fb157): per descriptor `INCRBY key hits`
//! then `EXPIRE key seconds`, where seconds is the unit's (1 to 31,536,000)
//! plus, when `EXPIRATION_JITTER_MAX_SECONDS` is above 0, a random 0 to
//! that − 1; a pipeline, not a transaction; the key as built
//! (`CACHE_KEY_PREFIX` first) with no hash tag. On one server or a Sentinel
//! master, one pipeline per request; on a cluster, one per key (each in its
//! own slot), the keys of a request concurrently. Any error fails the
//! request.
//!
//! [`UpstreamCounters`] wraps the crate's Redis store. A charge of the
//! service's counter policy (a fixed window of [`COUNTER_MAX`]: see
//! `service::counting`) becomes that pipeline on the charge's key, as is:
//! `INCRBY` by the cost (at most 2^40: above any `requests_per_unit`, so
//! the verdict is upstream's) then `EXPIRE`. Every other charge (the
//! extension algorithms, the health probe) goes to the crate's store, under
//! its own keys. The service sends a request's descriptors together, so
//! their pipelines share one round trip on one connection, and on a
//! cluster go to their slots concurrently, as upstream's do.
//!
//! A decision's receipt names the count after (its `at_ns`), so a lease
//! ([`super::leases`]) gives its unspent units back with `DECRBY` only
//! while they are the counter's last (a Lua script on the same key): no
//! count is handed out twice, and upstream pods still read one counter.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use tower_throttle::decision::{DecidedBy, PermitId, Receipt};
use tower_throttle::policy::Algorithm;
use tower_throttle::store::redis::{LazyRedisStore, SentinelConnection};
use tower_throttle::store::{Answer, BoxStore, Charge, Decisions, RuleSpec, Store, StoreError};
use tower_throttle::{Decision, Policy};

use super::redis_errors;

/// The service's counter of an upstream-format limit: a fixed window whose
/// limit no request reaches, so the store only counts.
pub const COUNTER_MAX: u64 = 1 << 50;

/// The unit in seconds when `policy` is the counter of a unit.
pub fn counter_seconds(policy: &Policy) -> Option<u64> {
    match policy.algorithm() {
        Algorithm::FixedWindow(_) if policy.limit() == COUNTER_MAX => {
            Some(policy.window().as_secs())
        }
        _ => None,
    }
}

/// Where the pipelines go.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server, connecting in the background.
    Single(LazyRedisStore),
    /// A cluster.
    Cluster(ClusterConnection),
    /// The master a Sentinel names (follows failovers).
    Sentinel(SentinelConnection),
}

/// The crate's Redis store, with upstream's counters: see the module docs.
#[derive(Clone)]
pub struct UpstreamCounters {
    conn: Conn,
    inner: BoxStore,
    jitter: Arc<Jitter>,
    timeout: Duration,
}

/// Upstream's `JitterRand.Int63n(EXPIRATION_JITTER_MAX_SECONDS)`: a
/// SplitMix64 sequence seeded from the clock and the process.
struct Jitter {
    max: u64,
    state: AtomicU64,
}

impl Jitter {
    fn new(max: u64) -> Jitter {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Jitter {
            max,
            state: AtomicU64::new(now ^ u64::from(std::process::id()).rotate_left(32)),
        }
    }

    /// 0 to `max` − 1 (0 when `max` is 0).
    fn next(&self) -> u64 {
        if self.max == 0 {
            return 0;
        }
        let mut z = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((u128::from(z) * u128::from(self.max)) >> 64) as u64
    }
}

impl UpstreamCounters {
    /// `inner` is the crate's store on the same Redis as `conn`.
    pub(super) fn new(conn: Conn, inner: BoxStore, jitter_max: u64, timeout: Duration) -> Self {
        UpstreamCounters {
            conn,
            inner,
            jitter: Arc::new(Jitter::new(jitter_max)),
            timeout,
        }
    }

    /// `INCRBY key cost` then `EXPIRE key seconds + jitter`, pipelined:
    /// the count after.
    async fn count(&self, key: &[u8], cost: u64, seconds: u64) -> Result<u64, StoreError> {
        let ttl = seconds.saturating_add(self.jitter.next());
        let mut pipe = redis::pipe();
        pipe.cmd("INCRBY").arg(key).arg(cost);
        pipe.cmd("EXPIRE").arg(key).arg(ttl).ignore();
        match self.send(&pipe).await {
            Ok(after) => Ok(u64::try_from(after).unwrap_or(0)),
            // A count past 2^63 − 1 (upstream pods charging huge addends):
            // full, so over whatever the limit, as the crate's counter
            // saturates. EXPIRE ran all the same.
            Err(Sent::Redis(e)) if redis_errors::is_overflow(&e) => Ok(i64::MAX as u64),
            Err(sent) => Err(self.failed(sent)),
        }
    }

    /// `pipe` on the connection: its first reply.
    async fn send(&self, pipe: &redis::Pipeline) -> Result<i64, Sent> {
        match &self.conn {
            Conn::Single(lazy) => match lazy.connected() {
                Some(store) => query(pipe, store.connection().clone(), self.timeout).await,
                None => Err(Sent::NotConnected),
            },
            Conn::Cluster(c) => query(pipe, c.clone(), self.timeout).await,
            Conn::Sentinel(c) => query(pipe, c.clone(), self.timeout).await,
        }
    }

    fn failed(&self, sent: Sent) -> StoreError {
        match sent {
            Sent::Redis(e) => redis_errors::map(e, self.timeout),
            Sent::TimedOut => StoreError::Timeout(self.timeout),
            Sent::NotConnected => StoreError::Connection(
                "Redis is not connected yet (retrying in the background)".into(),
            ),
        }
    }

    async fn check_counter(&self, rule: Charge<'_>, seconds: u64) -> Result<Decision, StoreError> {
        let after = self.count(rule.key, rule.cost, seconds).await?;
        let window = Duration::from_secs(seconds);
        Ok(Decision {
            allowed: true,
            limit: COUNTER_MAX,
            remaining: COUNTER_MAX.saturating_sub(after),
            retry_after: None,
            reset_after: window,
            quota_after: window,
            permit: None,
            decided_by: DecidedBy::Primary,
            charged: rule.cost,
            // The receipt names the count after: a lease's give-back takes
            // its units off only while they are the counter's last.
            charged_at_ns: after,
        })
    }

    /// A lease's unspent units back: `DECRBY key units` only while the
    /// counter still stands at `after`, the count its block left (no other
    /// count handed out since, so none is handed out twice); otherwise
    /// they lapse with the window.
    async fn give_back(&self, key: &[u8], units: u64, after: u64) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(GIVE_BACK)
            .arg(1)
            .arg(key)
            .arg(after)
            .arg(units.min(after));
        self.send(&pipe).await.map(drop).map_err(|s| self.failed(s))
    }
}

/// `DECRBY` of `ARGV[2]` if the key holds `ARGV[1]`; the count after, or
/// −1 when it did not.
const GIVE_BACK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
    return redis.call('DECRBY', KEYS[1], ARGV[2]) end return -1";

enum Sent {
    Redis(redis::RedisError),
    TimedOut,
    NotConnected,
}

async fn query<C: ConnectionLike>(
    pipe: &redis::Pipeline,
    mut conn: C,
    timeout: Duration,
) -> Result<i64, Sent> {
    match tokio::time::timeout(timeout, pipe.query_async::<(i64,)>(&mut conn)).await {
        Ok(Ok((after,))) => Ok(after),
        Ok(Err(e)) => Err(Sent::Redis(e)),
        Err(_) => Err(Sent::TimedOut),
    }
}

impl UpstreamCounters {
    /// One charge: a counter's pipeline, or the store under them.
    async fn check_one(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        match counter_seconds(rule.policy) {
            Some(seconds) => self.check_counter(rule, seconds).await,
            None => self.inner.check(rule).await,
        }
    }

    /// Counters never refuse, so a check of several is all or nothing as it
    /// is: each its own pipeline, sent together. Counters mixed with other
    /// policies could not be, and are refused.
    async fn check_rules(&self, rules: &[Charge<'_>]) -> Result<Decisions, StoreError> {
        let counters = rules
            .iter()
            .filter(|r| counter_seconds(r.policy).is_some())
            .count();
        if counters == 0 {
            return self.inner.decide(rules).await;
        }
        if counters < rules.len() {
            return Err(StoreError::InvalidRequest(
                "upstream counters and other policies in one all-or-nothing check",
            ));
        }
        if let [rule] = rules {
            return self.check_one(*rule).await.map(Decisions::one);
        }
        let checks = rules.iter().map(|r| self.check_one(*r));
        crate::backend::join::all(checks)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map(Decisions::from)
    }
}

impl Store for UpstreamCounters {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        // The store under the counters may answer at once.
        if charges.iter().all(|c| counter_seconds(c.policy).is_none()) {
            if let Some(answer) = self.inner.decide(charges).ready() {
                return Answer::Now(answer);
            }
        }
        Answer::later(self.check_rules(charges))
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        if counter_seconds(policy).is_some() {
            // The service never gives hits back, as upstream; leases give
            // back their unspent units, at the counter's tail only.
            return self.give_back(key, receipt.units(), receipt.at_ns()).await;
        }
        self.inner.refund(key, policy, receipt).await
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        if counter_seconds(policy).is_some() {
            return Err(StoreError::Unsupported("resets of upstream counters"));
        }
        self.inner.reset(key, policy).await
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.inner.release(key, policy, permit).await
    }

    /// Upstream's counters count any fixed window; every other limit is the
    /// store's under them to refuse.
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        let others: Vec<RuleSpec<'_>> = rules
            .iter()
            .filter(|r| counter_seconds(r.policy).is_none())
            .copied()
            .collect();
        self.inner.validate(&others)
    }
}
