//! One batch of checks: what it sends and what each caller gets back. The
//! checks waiting at the same moment go to Redis as ONE script call, which
//! evaluates them in order.
//!
//! Callers put a [`Job`] (its rules and a oneshot for the answer) on a
//! bounded channel; the batcher task (`batcher.rs`) decides when to send
//! what is queued, and [`execute`] sends it (on a cluster, one call per hash
//! slot). [`eval_checks`] picks the batch's shape (its script and arguments,
//! see `Shape`), sends it through the one send path (`eval.rs`) and reads
//! the reply. The script runs the checks one after another, so a batch
//! decides exactly what the same checks sent one by one in that order would,
//! and each caller gets its own answer (or its own error).
//!
//! Under load, checks gather while the previous batches are on the wire, so
//! the per-call costs of Redis (reading, parsing and dispatching a command,
//! starting a script, replying, the system calls) and of the client are paid
//! once per batch instead of once per check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::aio::ConnectionLike;
use redis::Value;
use tokio::sync::oneshot;

use super::queued::QueuedRule;
use super::registry::{check_script, ScriptId, UniformBatch};
use super::reply::{self, Checked, SentRule};
use super::{abandoned, eval, keys, Config};
use crate::store::StoreError;

/// A check waiting for the batcher.
pub(crate) struct Job {
    pub rules: Vec<QueuedRule>,
    /// The cluster slot of its keys (0 on a single server).
    pub slot: u16,
    pub reply: oneshot::Sender<Result<CheckOutcome, StoreError>>,
}

/// A check's answer: its decisions (and first rule's state), and the
/// script's `now` in ns.
pub(crate) struct CheckOutcome {
    pub checked: Checked,
    pub now_ns: u64,
    /// Releases the check's leases unless the caller takes the decisions.
    pub leases: Option<abandoned::LeaseGuard>,
}

/// A copy of an error that several callers share.
#[derive(Debug)]
struct SharedBatchError(String);

impl std::fmt::Display for SharedBatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SharedBatchError {}

/// The same kind of error, for another caller of a failed batch.
pub(crate) fn replicate(e: &StoreError) -> StoreError {
    let boxed = |e: &crate::store::BoxError| Box::new(SharedBatchError(e.to_string()));
    match e {
        StoreError::Full { max_keys } => StoreError::Full {
            max_keys: *max_keys,
        },
        StoreError::InvalidRequest(s) => StoreError::InvalidRequest(s),
        StoreError::Unsupported(s) => StoreError::Unsupported(s),
        StoreError::Timeout(d) => StoreError::Timeout(*d),
        StoreError::Unavailable(why) => StoreError::Unavailable(*why),
        StoreError::Connection(e) => StoreError::Connection(boxed(e)),
        StoreError::Script(e) => StoreError::Script(boxed(e)),
        StoreError::Cluster(e) => StoreError::Cluster(boxed(e)),
        StoreError::Protocol(s) => StoreError::Protocol(s.clone()),
        StoreError::Config(s) => StoreError::Config(s.clone()),
        StoreError::ForeignData { key, found } => StoreError::ForeignData {
            key: key.clone(),
            found: found.clone(),
        },
    }
}

/// Runs `checks` as one script call, in order. The outer error fails the
/// whole call; the inner ones are each check's own.
///
/// `sent` is set once the call is handed to the connection: until then (the
/// breaker failing it at once, a bad clock) the server cannot have run it.
pub(crate) async fn eval_checks<C>(
    conn: &C,
    cfg: &Config,
    checks: &[&[QueuedRule]],
    sent: &AtomicBool,
) -> Result<(u64, Vec<Result<Checked, StoreError>>), StoreError>
where
    C: ConnectionLike + Clone + Send,
{
    let shape = Shape::of(checks);
    let v = eval::script(conn, cfg, shape.script(checks), Some(sent), |cmd| {
        shape.args(cfg, checks, cmd)
    })
    .await?;
    let (now_ns, items) = reply::head(&v)?;
    let out = match shape {
        Shape::UniformGcra(rule, _) => uniform_gcra_replies(checks, rule, items, now_ns)?,
        Shape::UniformFixed(rule, _) => uniform_fixed_replies(checks, rule, items, now_ns)?,
        Shape::Uniform(..) | Shape::PerCheck => check_replies(checks, items, now_ns)?,
    };
    Ok((now_ns, out))
}

/// How a batch travels: the script it runs and its arguments.
#[derive(Clone, Copy)]
enum Shape<'a> {
    /// Single-rule GCRA checks of one policy and cost (`gcra_batch.lua`):
    /// no per-check arguments, one item per check in the reply.
    UniformGcra(&'a QueuedRule, ScriptId),
    /// Single-rule window or log checks of one policy and cost: the check
    /// script's `U` mode, no per-check arguments.
    Uniform(&'a QueuedRule, ScriptId),
    /// Single-rule fixed-window checks (windows in whole µs) of one policy
    /// and cost: the `U` mode's arguments (`fixed_batch.lua`), one item per
    /// check in the reply.
    UniformFixed(&'a QueuedRule, ScriptId),
    /// Anything else: the check script with each distinct policy once and
    /// per-check arguments.
    PerCheck,
}

impl<'a> Shape<'a> {
    fn of(checks: &[&'a [QueuedRule]]) -> Shape<'a> {
        let batch = |r: &QueuedRule| r.params.algorithm.uniform_batch(r.params.whole_us());
        match uniform(checks).map(|r| (r, batch(r))) {
            Some((rule, UniformBatch::Gcra(script))) => Shape::UniformGcra(rule, script),
            Some((rule, UniformBatch::SharedArguments(script))) => Shape::Uniform(rule, script),
            Some((rule, UniformBatch::Fixed(script))) => Shape::UniformFixed(rule, script),
            Some((_, UniformBatch::PerCheck)) | None => Shape::PerCheck,
        }
    }

    fn script(self, checks: &[&[QueuedRule]]) -> ScriptId {
        match self {
            Shape::UniformGcra(_, script)
            | Shape::Uniform(_, script)
            | Shape::UniformFixed(_, script) => script,
            Shape::PerCheck => {
                check_script(checks.iter().flat_map(|c| c.iter()).map(|r| &r.policy))
            }
        }
    }

    /// `EVALSHA`'s key count, keys and arguments.
    fn args(
        self,
        cfg: &Config,
        checks: &[&[QueuedRule]],
        cmd: &mut redis::Cmd,
    ) -> Result<(), StoreError> {
        let rules = || checks.iter().flat_map(|c| c.iter());
        cmd.arg(rules().count());
        for r in rules() {
            cmd.arg(&r.key[..]);
        }
        cmd.arg(cfg.now_arg()?).arg(cfg.ttl_padding_ms);
        let rule = match self {
            Shape::UniformGcra(rule, _) => {
                cmd.arg(rule.params.p1)
                    .arg(rule.params.p2)
                    .arg(rule.params.script_cost(rule.cost));
                return Ok(());
            }
            Shape::Uniform(rule, _) | Shape::UniformFixed(rule, _) => Some(rule),
            Shape::PerCheck => None,
        };
        // Each distinct policy once; rules name theirs by index (from 1).
        let mut policies: Vec<&QueuedRule> = Vec::new();
        for r in rules() {
            if !policies.iter().any(|p| p.policy == r.policy) {
                policies.push(r);
            }
        }
        cmd.arg(policies.len());
        for r in &policies {
            cmd.arg(r.params.algorithm.wire())
                .arg(r.params.p1)
                .arg(r.params.p2);
        }
        if let Some(rule) = rule {
            cmd.arg("U").arg(rule.params.script_cost(rule.cost));
            return Ok(());
        }
        let index_of =
            |r: &QueuedRule| 1 + policies.iter().take_while(|p| p.policy != r.policy).count();
        cmd.arg(checks.len());
        for c in checks {
            cmd.arg(c.len());
            for r in *c {
                cmd.arg(index_of(r)).arg(r.params.script_cost(r.cost));
                if r.policy.is_concurrency() {
                    cmd.arg(r.permit.map_or(0, |id| id.0));
                }
            }
        }
        Ok(())
    }
}

/// The one rule every check has, when every check is a single rule of one
/// policy and cost.
fn uniform<'a>(checks: &[&'a [QueuedRule]]) -> Option<&'a QueuedRule> {
    let [first] = checks.first()? else {
        return None;
    };
    let same =
        |c: &&[QueuedRule]| matches!(c, [r] if r.policy == first.policy && r.cost == first.cost);
    checks.iter().all(same).then_some(first)
}

/// What a reply is read against: the rule as sent.
fn sent(r: &QueuedRule) -> SentRule<'_> {
    SentRule {
        policy: &r.policy,
        cost: r.cost,
        permit: r.permit,
    }
}

/// The check script's flat reply, check by check.
fn check_replies(
    checks: &[&[QueuedRule]],
    items: &[Value],
    now_ns: u64,
) -> Result<Vec<Result<Checked, StoreError>>, StoreError> {
    let mut pos = 0;
    let mut out = Vec::with_capacity(checks.len());
    let mut broken: Option<String> = None;
    for c in checks {
        if let Some(why) = &broken {
            out.push(Err(StoreError::Protocol(why.clone())));
            continue;
        }
        let checked = match c {
            // One rule (most checks): nothing collected.
            [r] => reply::check(&[sent(r)], items, &mut pos, now_ns),
            _ => {
                let rules: Vec<SentRule<'_>> = c.iter().map(sent).collect();
                reply::check(&rules, items, &mut pos, now_ns)
            }
        };
        match checked {
            Ok(r) => out.push(r),
            Err(e) => {
                broken = Some(e.to_string());
                out.push(Err(e));
            }
        }
    }
    if broken.is_none() && pos != items.len() {
        return Err(StoreError::Protocol(format!(
            "{} items left after {} checks",
            items.len() - pos,
            checks.len()
        )));
    }
    Ok(out)
}

/// A uniform batch's reply, one item per check, each read by `read`.
fn one_item_per_check(
    checks: &[&[QueuedRule]],
    items: &[Value],
    read: impl Fn(&Value) -> Result<Result<Checked, StoreError>, StoreError>,
) -> Result<Vec<Result<Checked, StoreError>>, StoreError> {
    if items.len() != checks.len() {
        return Err(StoreError::Protocol(format!(
            "{} replies for {} checks",
            items.len(),
            checks.len()
        )));
    }
    items.iter().map(read).collect()
}

/// A uniform GCRA batch's reply: one number per check.
fn uniform_gcra_replies(
    checks: &[&[QueuedRule]],
    rule: &QueuedRule,
    items: &[Value],
    now_ns: u64,
) -> Result<Vec<Result<Checked, StoreError>>, StoreError> {
    one_item_per_check(checks, items, |item| {
        reply::uniform_gcra(&rule.policy, rule.cost, item, now_ns)
    })
}

/// A uniform fixed-window batch's reply (`fixed_batch.lua`): one item per
/// check.
fn uniform_fixed_replies(
    checks: &[&[QueuedRule]],
    rule: &QueuedRule,
    items: &[Value],
    now_ns: u64,
) -> Result<Vec<Result<Checked, StoreError>>, StoreError> {
    let sent = sent(rule);
    one_item_per_check(checks, items, |item| {
        reply::uniform_fixed(&sent, rule.params.p2 / 1000, item, now_ns)
    })
}

/// Sends `jobs` as one script call and answers each caller.
pub(crate) async fn execute<C>(conn: C, cfg: Arc<Config>, jobs: Vec<Job>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let sent = AtomicBool::new(false);
    let result = {
        let checks: Vec<&[QueuedRule]> = jobs.iter().map(|j| &j.rules[..]).collect();
        eval_checks(&conn, &cfg, &checks, &sent).await
    };
    match result {
        Ok((now_ns, results)) => {
            for (job, r) in jobs.into_iter().zip(results) {
                let leases =
                    abandoned::holds_permits(&job.rules).then(|| abandoned::permits_of(&job.rules));
                let r = match (r, leases) {
                    // Leases its caller never takes are released: the
                    // guard goes back unsent, or is dropped unread with the
                    // caller's channel (see abandoned::LeaseGuard).
                    (Ok(checked), Some(leases)) => Ok(CheckOutcome {
                        checked,
                        now_ns,
                        leases: Some(abandoned::LeaseGuard::new(
                            conn.clone(),
                            cfg.clone(),
                            leases,
                        )),
                    }),
                    (Ok(checked), None) => Ok(CheckOutcome {
                        checked,
                        now_ns,
                        leases: None,
                    }),
                    // Told of an error after the script ran: released here.
                    (Err(e), leases) => {
                        if let Some(leases) = leases {
                            abandoned::release(conn.clone(), cfg.clone(), leases);
                        }
                        Err(e)
                    }
                };
                let _ = job.reply.send(r);
            }
        }
        Err(e) => {
            for job in jobs {
                // A call that was sent may have run (a timeout, a broken
                // connection); one that was not cannot have.
                if sent.load(Ordering::Relaxed) && abandoned::holds_permits(&job.rules) {
                    let leases = abandoned::permits_of(&job.rules);
                    abandoned::release(conn.clone(), cfg.clone(), leases);
                }
                let _ = job.reply.send(Err(replicate(&e)));
            }
        }
    }
}

/// The slot of a job whose first key is tagged `tag`.
pub(crate) fn slot_of(tag: &[u8; 8]) -> u16 {
    keys::slot(tag)
}
