//! Redis Sentinel: the store finds the master by name through the
//! sentinels, and follows a failover.
//!
//! [`SentinelConnection`] holds a [`ConnectionManager`] to the master the
//! sentinels named last, and asks them again every
//! [`sentinel_poll_interval`](super::RedisStoreBuilder::sentinel_poll_interval)
//! (a demoted master that is still up keeps taking writes until the
//! sentinels reconfigure it, about 8 s after a `SENTINEL FAILOVER`: writes
//! there are lost, so the store must not wait to be told). A reply that says
//! the server is no longer the master (`READONLY`) or a broken connection
//! makes it ask at once, once per connection generation however many calls
//! fail together. When the sentinels name another address it swaps in a
//! connection to it. A `READONLY` call changed nothing, so it is retried once
//! on the new master; any other failed call is returned as it is (it may have
//! been applied) and the layer's fail mode answers it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{Client, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use super::preflight::Nodes;
use super::RedisStore;

// Connecting: the builder's `connect_sentinel` and kin.
mod connect;

/// A [`RedisStore`] whose master is found, and followed, through Redis
/// Sentinel: see
/// [`RedisStoreBuilder::connect_sentinel`](super::RedisStoreBuilder::connect_sentinel).
pub type RedisSentinelStore = RedisStore<SentinelConnection>;

/// A connection to the master of a Sentinel-monitored group, that moves to
/// the new master after a failover. Clones share it.
#[derive(Clone)]
pub struct SentinelConnection {
    inner: Arc<SentinelShared>,
}

struct SentinelShared {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The connection generation, the master's address and connection.
    current: RwLock<(u64, String, ConnectionManager)>,
    config: ConnectionManagerConfig,
    timeout: Duration,
    master: String,
}

impl std::fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelConnection")
            .field("master", &self.inner.master)
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl SentinelConnection {
    fn current(&self) -> (u64, ConnectionManager) {
        let c = self.inner.current.read().unwrap_or_else(|e| e.into_inner());
        (c.0, c.2.clone())
    }

    /// How many times the connection has moved to a newly named master.
    pub fn generation(&self) -> u64 {
        self.current().0
    }

    /// Asks the sentinels for the master and connects to it, unless another
    /// caller already did since generation `seen`.
    async fn follow(&self, seen: u64) -> RedisResult<()> {
        let mut sentinel = self.inner.sentinel.lock().await;
        if self.generation() != seen {
            return Ok(());
        }
        let client = master_client(&mut sentinel, self.inner.timeout).await?;
        let addr = client.get_connection_info().addr().to_string();
        if self
            .inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            == addr
        {
            // Same server: its connection manager reconnects by itself.
            return Ok(());
        }
        let conn = ConnectionManager::new_with_config(client, self.inner.config.clone()).await?;
        let mut c = self
            .inner
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner());
        *c = (seen + 1, addr.clone(), conn);
        tracing::warn!(target: "tower_throttle", master = %self.inner.master, addr = %addr,
            "Redis Sentinel: following the master to a new address");
        Ok(())
    }

    /// Asks the sentinels every `every` while the connection lives.
    fn poll(&self, every: Duration) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let conn = SentinelConnection { inner };
                let seen = conn.generation();
                if let Err(e) = conn.follow(seen).await {
                    tracing::debug!(target: "tower_throttle", error = %e,
                        "Redis Sentinel: cannot ask the sentinels for the master");
                }
            }
        });
    }
}

/// A client of the master the sentinels name now.
async fn master_client(sentinel: &mut SentinelClient, timeout: Duration) -> RedisResult<Client> {
    tokio::time::timeout(timeout, sentinel.async_get_client())
        .await
        .map_err(|_| RedisError::from((ErrorKind::Io, "the sentinels did not answer in time")))?
}

/// Whether `e` says the connection no longer reaches the master.
fn lost_master(e: &RedisError) -> bool {
    is_readonly(e) || e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

fn is_readonly(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.to_string().contains("READONLY")
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (seen, mut conn) = self.current();
            match conn.req_packed_command(cmd).await {
                Err(e) if lost_master(&e) => {
                    let followed = self.follow(seen).await;
                    if is_readonly(&e) && followed.is_ok() {
                        // Refused by a replica: nothing was written, so the
                        // new master may take it.
                        let (_, mut conn) = self.current();
                        return conn.req_packed_command(cmd).await;
                    }
                    Err(e)
                }
                r => r,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (seen, mut conn) = self.current();
            let r = conn.req_packed_commands(cmd, offset, count).await;
            if let Err(e) = &r {
                if lost_master(e) {
                    let _ = self.follow(seen).await;
                }
            }
            r
        })
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}

impl Nodes for SentinelConnection {
    async fn on_each(&mut self, cmd: Cmd) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        Ok(vec![(String::new(), cmd.query_async::<Value>(self).await)])
    }
}
