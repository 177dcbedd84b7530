//! No offline queue: after a call times out, nothing but one probe at a time
//! is sent until the server answers again.
//!
//! A server that stops answering (frozen, swapping, overloaded) still has
//! open TCP connections, and the kernel buffers whatever the client writes to
//! them. Without this guard every check made meanwhile would be written to
//! the socket, answered by the fail mode, and then executed by the server
//! when it wakes up: a burst of stale commands charging quota for requests
//! that were already answered. Here the first timeout trips the breaker;
//! while tripped, calls fail at once with [`StoreError::Timeout`] and one
//! caller at a time sends a `PING` (harmless if it runs late); the first
//! answered probe closes the breaker. At most the calls already in flight
//! when the server stopped, plus one `PING` per timeout, reach it late.
//!
//! A server that is down (connection refused) is left to the connection
//! manager's reconnects: nothing is buffered there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::error::timed;
use super::Config;
use crate::store::StoreError;

#[derive(Debug, Default)]
pub(crate) struct Breaker {
    tripped: AtomicBool,
    probing: AtomicBool,
}

impl Breaker {
    /// Runs `call` unless the server is unresponsive. Single servers only:
    /// on a cluster a timeout concerns one master, not the store.
    pub(crate) async fn guard<C, T>(
        &self,
        conn: &C,
        cfg: &Config,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError>
    where
        C: ConnectionLike + Clone + Send,
    {
        if cfg.cluster {
            return call.await;
        }
        self.admit(conn, cfg.timeout).await?;
        let result = call.await;
        self.record(&result);
        result
    }

    /// Lets a call through, or fails it at once while the server is unresponsive.
    async fn admit<C: ConnectionLike + Clone + Send>(
        &self,
        conn: &C,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        if !self.tripped.load(Ordering::Acquire) {
            return Ok(());
        }
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(StoreError::Timeout(timeout));
        }
        let mut conn = conn.clone();
        let probe = timed(timeout, async move {
            conn.req_packed_command(&redis::cmd("PING")).await
        })
        .await;
        self.probing.store(false, Ordering::Release);
        match probe {
            Ok(_) => {
                self.tripped.store(false, Ordering::Release);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Trips on a timeout; any answer from the server closes it.
    fn record<T>(&self, result: &Result<T, StoreError>) {
        match result {
            Err(StoreError::Timeout(_)) => self.tripped.store(true, Ordering::Release),
            Ok(_) | Err(StoreError::Script(_) | StoreError::Protocol(_)) => {
                self.tripped.store(false, Ordering::Release)
            }
            Err(_) => {}
        }
    }
}
