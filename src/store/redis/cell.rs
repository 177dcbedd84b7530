//! [`CellStore`]: GCRA through redis-cell's native `CL.THROTTLE`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{IntoConnectionInfo, Value};

use super::breaker::Breaker;
use super::error::{surfaced, timed};
use super::validate::cell_args;
use super::{keys, reply, CellStoreBuilder};
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, GcraParams, Policy};
use crate::store::{Answer, Charge, Decisions, RuleSpec, Store, StoreError};

const NOT_LOADED: StoreError = StoreError::Unsupported(
    "CL.THROTTLE: the redis-cell module is not loaded on this Redis server \
     (load it with `--loadmodule libredis_cell.so`, or use RedisStore)",
);

/// A [`Store`] that sends GCRA checks to the redis-cell module's
/// `CL.THROTTLE key max_burst count period quantity`, for deployments that
/// already run it. Decisions are redis-cell's, in whole seconds.
///
/// Only [`Policy::cell`] policies with a period of whole seconds, one rule
/// per check: `CL.THROTTLE` receives exactly the `max_burst`, `count` and
/// `period` given to [`Policy::cell`]. Anything else — other algorithms,
/// funnels and token buckets, sub-second periods — is
/// [`StoreError::Unsupported`]. [`Store::refund`] is unsupported
/// (redis-cell has no refund); [`Store::reset`] deletes the key.
/// [`CellStore::connect`] fails with a clear [`StoreError::Unsupported`] when
/// the module is not loaded. Keys are `<prefix>:<key>`, encoded as in
/// [`RedisStore`](super::RedisStore). Configure it with
/// [`CellStore::builder`]. As with `RedisStore`, a call that times out
/// makes the next calls fail at once until the server answers again, so
/// nothing queues behind an unresponsive server.
///
/// Clones share the connection.
#[derive(Clone)]
pub struct CellStore {
    conn: ConnectionManager,
    prefix: String,
    timeout: Duration,
    breaker: Arc<Breaker>,
    /// Refuses two layers sharing counters by accident (shared by clones).
    namespaces: crate::store::Namespaces,
}

impl std::fmt::Debug for CellStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CellStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn secs(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(n) => Ok(*n),
        other => Err(StoreError::Protocol(format!(
            "CL.THROTTLE: expected an integer, got {other:?}"
        ))),
    }
}

/// Fills in `quota_after` from the (whole-second) reset of a `CL.THROTTLE`
/// reply, never past a denial's `retry_after`.
fn with_quota_after(p: &GcraParams, d: Decision) -> Decision {
    let ttl = u64::try_from(d.reset_after.as_nanos()).unwrap_or(u64::MAX);
    let quota_after = crate::algorithm::gcra::quota_after(p, ttl, d.remaining);
    Decision {
        quota_after: d.retry_after.map_or(quota_after, |r| quota_after.min(r)),
        ..d
    }
}

/// Maps `[limited, limit, remaining, retry_after_s, reset_after_s]`
/// (`quota_after` left zero: see [`with_quota_after`]).
fn decision(v: &Value) -> Result<Decision, StoreError> {
    let items = reply::array(v)?;
    let [limited, limit, remaining, retry, reset] = items else {
        return Err(StoreError::Protocol(format!(
            "CL.THROTTLE replied {} items, not 5",
            items.len()
        )));
    };
    let allowed = match int(limited)? {
        0 => true,
        1 => false,
        n => return Err(StoreError::Protocol(format!("CL.THROTTLE limited = {n}"))),
    };
    let nonneg = |n: i64| {
        u64::try_from(n).map_err(|_| StoreError::Protocol(format!("CL.THROTTLE value {n}")))
    };
    let retry = int(retry)?;
    Ok(Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: nonneg(int(limit)?)?,
        remaining: nonneg(int(remaining)?)?,
        retry_after: (!allowed && retry >= 0).then(|| secs(retry)),
        reset_after: secs(int(reset)?),
        quota_after: Duration::ZERO,
        permit: None,
    })
}

fn is_unknown_command(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unknown command")
}

impl CellStore {
    /// Configures a store: prefix, timeout, eviction check, TLS.
    pub fn builder() -> CellStoreBuilder {
        CellStoreBuilder::default()
    }

    /// Connects with `builder`'s settings: a [`CellStoreBuilder`], or the
    /// [`RedisStoreBuilder`](super::RedisStoreBuilder) settings that apply
    /// (prefix, timeout, eviction check, TLS). See
    /// [`CellStoreBuilder::connect`].
    pub async fn connect(
        builder: impl Into<CellStoreBuilder>,
        info: impl IntoConnectionInfo,
    ) -> Result<CellStore, StoreError> {
        builder.into().connect(info).await
    }

    pub(crate) fn new(conn: ConnectionManager, prefix: String, timeout: Duration) -> CellStore {
        CellStore {
            conn,
            prefix,
            timeout,
            breaker: Arc::default(),
            namespaces: Default::default(),
        }
    }

    /// Fails with [`StoreError::Unsupported`] unless `CL.THROTTLE` exists.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("CL.THROTTLE");
        let v: Value = timed(self.timeout, cmd.query_async(&mut conn)).await?;
        match reply::array(&v)? {
            [Value::Array(_)] => Ok(()),
            _ => Err(NOT_LOADED),
        }
    }

    /// The Redis key of `key`.
    pub fn redis_key(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + 2 + key.len());
        out.extend_from_slice(self.prefix.as_bytes());
        out.push(b':');
        keys::push_user_key(&mut out, key);
        out
    }

    fn gcra(policy: &Policy) -> Result<GcraParams, StoreError> {
        match policy.algorithm() {
            Algorithm::Gcra(p) => Ok(*p),
            Algorithm::SlidingLog(_)
            | Algorithm::FixedWindow(_)
            | Algorithm::SlidingWindow(_)
            | Algorithm::Concurrency(_) => Err(StoreError::Unsupported(
                "policies other than GCRA on CellStore (redis-cell)",
            )),
        }
    }
}

impl CellStore {
    /// One `CL.THROTTLE` call for `rule`.
    async fn throttle(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        let params = Self::gcra(rule.policy)?;
        let (burst, count, period) = cell_args(&params)?;
        // A cost above the limit is denied for ever whatever its size, with
        // the same reply; redis-cell parses quantities as i64 and multiplies
        // them by the interval, so a larger one is an error or an overflow
        // in the server.
        let quantity = rule.cost.min(params.limit.saturating_add(1));
        let mut cmd = redis::cmd("CL.THROTTLE");
        cmd.arg(self.redis_key(rule.key))
            .arg(burst)
            .arg(count)
            .arg(period)
            .arg(quantity);
        let mut conn = self.conn.clone();
        let call = async {
            match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
                Err(_) => Err(StoreError::Timeout(self.timeout)),
                Ok(Err(e)) if is_unknown_command(&e) => Err(NOT_LOADED),
                Ok(r) => r.map_err(|e| super::error::map(e, self.timeout)),
            }
        };
        let v: Value = surfaced(
            self.breaker
                .guard_single(&self.conn, self.timeout, call)
                .await,
        )?;
        surfaced(decision(&v)).map(|d| with_quota_after(&params, d))
    }
}

impl Store for CellStore {
    /// Refuses policies other than GCRA, and more than one rule per check.
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        super::validate::cell(rules)
    }

    fn namespaces(&self) -> Option<&crate::store::Namespaces> {
        Some(&self.namespaces)
    }

    /// `CL.THROTTLE` takes `Policy::cell`'s own arguments: no widened
    /// tolerance, so delay mode checks again instead of reserving.
    fn reserves_slots(&self) -> bool {
        false
    }

    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        Answer::Later(async move {
            match charges {
                [charge] => self.throttle(*charge).await.map(Decisions::one),
                [] => Ok(Decisions::from(Vec::new())),
                _ => Err(StoreError::Unsupported(
                    "multi-rule checks on CellStore (CL.THROTTLE is one key at a time)",
                )),
            }
        })
    }

    async fn refund(
        &self,
        _: &[u8],
        _: &Policy,
        _: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        Err(StoreError::Unsupported("refunds on CellStore (redis-cell)"))
    }

    async fn reset(&self, key: &[u8], _: &Policy) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let mut del = redis::cmd("DEL");
        del.arg(self.redis_key(key));
        let call = timed(self.timeout, del.query_async::<Value>(&mut conn));
        surfaced(
            self.breaker
                .guard_single(&self.conn, self.timeout, call)
                .await,
        )
        .map(drop)
    }

    async fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_cell_arguments_and_reply() {
        let p = |b, c, s| match *Policy::cell(b, c, Duration::from_secs(s))
            .unwrap()
            .algorithm()
        {
            Algorithm::Gcra(p) => p,
            _ => unreachable!(),
        };
        assert_eq!(cell_args(&p(15, 30, 60)).unwrap(), (15, 30, 60));
        assert_eq!(cell_args(&p(4, 10, 1)).unwrap(), (4, 10, 1));
        assert_eq!(cell_args(&p(0, 3, 28354)).unwrap(), (0, 3, 28354));
        let gcra = |p: Policy| match *p.algorithm() {
            Algorithm::Gcra(p) => p,
            _ => unreachable!(),
        };
        let bucket = gcra(Policy::token_bucket(16, 0.5).unwrap());
        assert!(matches!(
            cell_args(&bucket),
            Err(StoreError::Unsupported(_))
        ));
        let sub_second = gcra(Policy::cell(1, 1, Duration::from_millis(1500)).unwrap());
        assert!(matches!(
            cell_args(&sub_second),
            Err(StoreError::Unsupported(_))
        ));
        let reply = Value::Array([1, 16, 0, 2, 32].map(Value::Int).to_vec());
        let d = decision(&reply).unwrap();
        assert_eq!(d.to_cell_reply(), [1, 16, 0, 2, 32]);
        let fresh = Value::Array([0, 16, 15, -1, 2].map(Value::Int).to_vec());
        assert_eq!(
            decision(&fresh).unwrap().to_cell_reply(),
            [0, 16, 15, -1, 2]
        );
        assert!(decision(&Value::Array(vec![Value::Int(0)])).is_err());
        assert!(decision(&Value::Nil).is_err());
    }
}
