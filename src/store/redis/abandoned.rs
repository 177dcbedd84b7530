//! Concurrency leases nobody will release: the check's caller gave up (its
//! future dropped, its timeout fired) or got an error, while the check may
//! have been, or may still be, granted by Redis.
//!
//! Such a lease would lock its key for the whole lease. Instead, when the
//! reply reaches no one, or the call failed in a way that leaves its fate
//! unknown, the store releases the permit itself, in a task of its own,
//! retried until Redis answers or the lease would have lapsed anyway. The
//! release leaves a tombstone when the permit is not (yet) held, so a check
//! still on its way (sent before a stall, on a connection since replaced)
//! is not granted when it finally runs: no order of arrival leaks a lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tokio::sync::oneshot;

use super::queued::QueuedRule;
use super::registry::ScriptId;
use super::{eval, Config};
use crate::decision::PermitId;
use crate::policy::Algorithm;
use crate::store::StoreError;

/// First pause between release attempts; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A permit to release: its Redis key, id and lease.
pub(crate) struct Abandoned {
    key: Vec<u8>,
    permit: PermitId,
    lease: Duration,
}

impl Abandoned {
    pub(crate) fn new(key: Vec<u8>, permit: PermitId, lease: Duration) -> Self {
        Abandoned { key, permit, lease }
    }
}

/// The permits `rules` asked for (none unless a rule is a concurrency one).
pub(crate) fn permits_of(rules: &[QueuedRule]) -> Vec<Abandoned> {
    rules
        .iter()
        .filter_map(|r| {
            let Algorithm::Concurrency(p) = r.policy.algorithm() else {
                return None;
            };
            Some(Abandoned {
                key: r.key.clone(),
                permit: r.permit?,
                lease: Duration::from_nanos(p.lease_ns),
            })
        })
        .collect()
}

/// True when a check of `rules` may be granted a lease.
pub(crate) fn holds_permits(rules: &[QueuedRule]) -> bool {
    rules.iter().any(|r| r.permit.is_some())
}

/// Releases a granted check's leases when dropped, unless disarmed by the
/// caller that takes its decisions. It travels with the reply: a caller
/// dropped after the reply was sent, but before it read it, drops the
/// guard with its channel.
pub(crate) struct LeaseGuard(Option<Box<dyn FnOnce() + Send>>);

impl LeaseGuard {
    pub(crate) fn new<C>(conn: C, cfg: Arc<Config>, permits: Vec<Abandoned>) -> Self
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        LeaseGuard(Some(Box::new(move || release(conn, cfg, permits))))
    }

    /// The caller holds the permits now.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

/// Releases `permits` in the background (tombstoning those not yet held).
pub(crate) fn release<C>(conn: C, cfg: Arc<Config>, permits: Vec<Abandoned>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    // Without a runtime (one shutting down) the leases lapse by themselves.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if permits.is_empty() {
        return;
    }
    runtime.spawn(async move {
        for p in permits {
            release_one(&conn, &cfg, &p).await;
        }
    });
}

/// Releases `p`, telling `first` how the first attempt went; after a
/// failure that may be passing, keeps trying in the background.
pub(crate) async fn release_reporting<C>(
    conn: C,
    cfg: Arc<Config>,
    p: Abandoned,
    first: oneshot::Sender<Result<(), StoreError>>,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let r = attempt(&conn, &cfg, &p).await;
    let passing = r.as_ref().is_err_and(StoreError::is_unavailable);
    let _ = first.send(r);
    if passing {
        release_one(&conn, &cfg, &p).await;
    }
}

/// One release; the tombstone covers a check that has not arrived yet.
async fn attempt<C>(conn: &C, cfg: &Config, p: &Abandoned) -> Result<(), StoreError>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    let v = eval::script(conn, cfg, ScriptId::Release, None, |cmd| {
        cmd.arg(1)
            .arg(&p.key[..])
            .arg(cfg.now_arg()?)
            .arg(cfg.ttl_padding_ms)
            .arg(p.permit.0.to_string())
            // Whole µs, rounded up: the tombstone outlives a lease in ns.
            .arg(p.lease.as_nanos().div_ceil(1000).to_string());
        Ok(())
    });
    v.await.map(drop)
}

async fn release_one<C>(conn: &C, cfg: &Config, p: &Abandoned)
where
    C: ConnectionLike + Clone + Send + Sync,
{
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    loop {
        match attempt(conn, cfg, p).await {
            Ok(()) => return,
            // Not passing (a script error, a bad clock): retrying won't help.
            Err(
                StoreError::Script(_)
                | StoreError::Protocol(_)
                | StoreError::Unsupported(_)
                | StoreError::Config(_),
            ) => return,
            Err(_) => {}
        }
        // Past its lease the permit has lapsed by itself.
        if started.elapsed() + backoff >= p.lease {
            tracing::warn!(
                "tower-throttle: could not release a concurrency permit; \
                 it lapses with its lease"
            );
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
