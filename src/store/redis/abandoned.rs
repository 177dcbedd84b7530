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

use super::batch::JobRule;
use super::error::timed;
use super::{Config, RELEASE};
use crate::decision::PermitId;
use crate::policy::Algorithm;

/// First pause between release attempts; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// A permit to release: its Redis key, id and lease.
pub(crate) struct Abandoned {
    key: Vec<u8>,
    permit: PermitId,
    lease: Duration,
}

/// The permits `rules` asked for (none unless a rule is a concurrency one).
pub(crate) fn permits_of(rules: &[JobRule]) -> Vec<Abandoned> {
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
pub(crate) fn holds_permits(rules: &[JobRule]) -> bool {
    rules.iter().any(|r| r.permit.is_some())
}

/// Releases `permits` in the background (tombstoning those not yet held).
pub(crate) fn release<C>(conn: C, cfg: Arc<Config>, permits: Vec<Abandoned>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if permits.is_empty() {
        return;
    }
    tokio::spawn(async move {
        for p in permits {
            release_one(&conn, &cfg, &p).await;
        }
    });
}

async fn release_one<C>(conn: &C, cfg: &Config, p: &Abandoned)
where
    C: ConnectionLike + Clone + Send + Sync,
{
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let lease_us = p.lease.as_micros().to_string();
    let permit = p.permit.0.to_string();
    loop {
        let Ok(now) = cfg.now_arg() else { return };
        let mut inv = RELEASE.prepare_invoke();
        inv.key(&p.key[..])
            .arg(now)
            .arg(cfg.ttl_padding_ms)
            .arg(&permit)
            .arg(&lease_us);
        let mut c = conn.clone();
        let call = timed(cfg.timeout, inv.invoke_async::<redis::Value>(&mut c));
        if cfg.breaker.guard(conn, cfg, call).await.is_ok() {
            return;
        }
        // Past its lease the permit has lapsed by itself.
        if started.elapsed() + backoff >= p.lease {
            tracing::warn!(
                "tower-throttle: could not release an abandoned concurrency permit; \
                 it lapses with its lease"
            );
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
