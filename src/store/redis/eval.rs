//! Every script call of the Redis store, sent one way: `EVALSHA` of a
//! [`ScriptId`], loaded and retried once on `NOSCRIPT`, bounded by the store
//! timeout, under the breaker (`breaker.rs`). Checks (`batch.rs`), refunds
//! (`ops.rs`) and releases (`abandoned.rs`) only build their arguments.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::error::timed;
use super::registry::ScriptId;
use super::Config;
use crate::store::StoreError;

/// Runs script `id` with the keys and arguments `args` appends (the key
/// count first, as `EVALSHA` reads them).
///
/// `sent`, when given, is set once the call is handed to the connection:
/// until then (a bad clock in `args`, the breaker failing it at once) the
/// server cannot have run it.
pub(crate) async fn script<C>(
    conn: &C,
    cfg: &Config,
    id: ScriptId,
    sent: Option<&AtomicBool>,
    args: impl FnOnce(&mut Cmd) -> Result<(), StoreError>,
) -> Result<Value, StoreError>
where
    C: ConnectionLike + Clone + Send,
{
    let script = id.script();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash());
    args(&mut cmd)?;
    let mut c = conn.clone();
    let call = async {
        if let Some(sent) = sent {
            sent.store(true, Ordering::Relaxed);
        }
        timed(cfg.timeout, query(&mut c, script, &cmd)).await
    };
    cfg.breaker.guard(conn, cfg, call).await
}

async fn query<C: ConnectionLike>(
    conn: &mut C,
    script: &Script,
    cmd: &Cmd,
) -> Result<Value, RedisError> {
    match cmd.query_async(conn).await {
        // SCRIPT FLUSH, a restarted server or a failover: load and retry
        // once. A NOSCRIPT that survives this is an outage (error::outage).
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        r => r,
    }
}
