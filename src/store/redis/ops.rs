//! The store's operations: checks (alone or through the batcher), refunds,
//! resets and releases, and the permit ids it hands out.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;
use tokio::sync::oneshot;

use super::batch::{self, CheckOutcome, Job};
use super::config::Config;
use super::deny::DenyCache;
use super::error::{surfaced, timed};
use super::params::Params;
use super::queued::QueuedRule;
use super::registry::ScriptId;
use super::{abandoned, batcher, eval, keys, validate, RedisStore};
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Answer, Charge, Decisions, RuleSpec, Store, StoreError};

/// Permit ids: a random per-store base plus a counter, so instances sharing
/// a key never hand out the same id.
#[derive(Debug)]
pub(super) struct PermitIdSource {
    base: u64,
    next: AtomicU64,
}

impl PermitIdSource {
    pub(super) fn new() -> Self {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(t.as_nanos());
        }
        PermitIdSource {
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

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) fn with_config(conn: C, cfg: Config) -> Self {
        RedisStore {
            conn,
            deny: Arc::new(DenyCache::new(cfg.deny_cache, &cfg.time)),
            cfg: Arc::new(cfg),
            permits: Arc::new(PermitIdSource::new()),
            batcher: Arc::new(OnceLock::new()),
            namespaces: Default::default(),
        }
    }

    /// Loads the scripts (`SCRIPT LOAD`; on a cluster, on every master), so
    /// the first checks need no reload round trip.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        for id in ScriptId::ALL {
            timed(self.cfg.timeout, id.script().load_async(&mut conn)).await?;
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
    async fn run_check(
        &self,
        rules: Vec<QueuedRule>,
        slot: u16,
    ) -> Result<CheckOutcome, StoreError> {
        // A check that may be granted a lease runs in a task of its own, so
        // that its reply is seen even if the caller is gone (see abandoned.rs).
        if !self.cfg.batch.enabled && !abandoned::holds_permits(&rules) {
            let sent = std::sync::atomic::AtomicBool::new(false);
            let (now_ns, mut r) =
                batch::eval_checks(&self.conn, &self.cfg, &[&rules], &sent).await?;
            let checked = r
                .pop()
                .ok_or_else(|| StoreError::Protocol("no check in the reply".into()))??;
            return Ok(CheckOutcome {
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
    /// [`HashTag`](super::HashTag).
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        validate::rules(rules, &self.cfg.tag, self.cfg.cluster)
    }

    /// A denial the deny cache holds is answered at once; every other
    /// check is one script call.
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        if let [charge] = charges {
            if let Some(denied) = self.cached_denial(charge) {
                return Answer::Now(Ok(Decisions::one(denied)));
            }
        }
        Answer::later(async move { surfaced(self.check_rules(charges).await).map(Decisions::from) })
    }

    /// A cached denial as it is; every other check as `decide` makes it.
    async fn check(&self, charge: Charge<'_>) -> Result<Decision, StoreError> {
        if let Some(denied) = self.cached_denial(&charge) {
            return Ok(denied);
        }
        surfaced(self.check_rules(std::slice::from_ref(&charge)).await)?
            .pop()
            .ok_or_else(|| StoreError::Protocol("no decision in the reply".into()))
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        surfaced(self.refund_receipt(key, policy, receipt).await)
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let rk = self.redis_key(key, policy);
        let mut del = redis::cmd("DEL");
        del.arg(&rk[..]);
        let call = timed(self.cfg.timeout, del.query_async::<Value>(&mut conn));
        surfaced(self.invalidating(&rk, call).await.map(drop))
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        surfaced(self.release_permit(key, policy, permit).await)
    }
}

/// The operations behind [`Store`]'s, whose errors [`surfaced`] reports.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    async fn check_rules(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
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
            job.push(QueuedRule {
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
        // A single rule the cache did not answer (see `cached_denial`) may
        // teach it.
        let cached = (rules.len() == 1 && self.deny.enabled()).then(|| {
            let r = &job[0];
            (r.key.clone(), r.cost, self.deny.ticket())
        });
        let CheckOutcome {
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

    /// The denial cache's answer for a single-rule check, if it holds one:
    /// before anything of the check is built, so a cached denial costs a
    /// key written into this thread's buffer and one lookup.
    fn cached_denial(&self, rule: &Charge<'_>) -> Option<Decision> {
        if !self.deny.may_answer(rule.cost) {
            return None;
        }
        // A policy the scripts refuse is refused by the check, never
        // answered from the cache.
        Params::of(rule.policy).ok()?;
        thread_local! {
            static KEY: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        KEY.with(|buffer| {
            let mut key = buffer.borrow_mut();
            key.clear();
            let tag = self.cfg.tag.tag(rule.key);
            keys::push_redis_key(&mut key, &self.cfg.prefix, tag, rule.policy, rule.key);
            self.deny.lookup(&key, rule.policy, rule.cost)
        })
    }

    async fn refund_receipt(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        let p = Params::of(policy)?;
        let amount = receipt.units();
        if amount == 0 {
            return Ok(());
        }
        // The receipt's slot: its instant on the server's clock, in µs.
        let rk = self.redis_key(key, policy);
        let now = self.now_arg()?;
        let call = eval::script(&self.conn, &self.cfg, ScriptId::Refund, None, |cmd| {
            cmd.arg(1)
                .arg(&rk[..])
                .arg(now)
                .arg(self.cfg.ttl_padding_ms)
                .arg(p.algorithm.wire())
                .arg(p.p1)
                .arg(p.p2)
                .arg(p.script_amount(amount))
                .arg(receipt.at_ns() / 1000)
                .arg(
                    receipt
                        .permit()
                        .map_or(String::new(), |id| id.0.to_string()),
                );
            Ok(())
        });
        self.invalidating(&rk, call).await.map(drop)
    }

    async fn release_permit(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        // Only concurrency limits hold permits.
        let p = match policy.algorithm() {
            Algorithm::Concurrency(p) => p,
            Algorithm::Gcra(_)
            | Algorithm::FixedWindow(_)
            | Algorithm::SlidingWindow(_)
            | Algorithm::SlidingLog(_) => return Ok(()),
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
