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
//!
//! Cancellation: the probe's claim is held by a guard, so a caller dropped
//! while its `PING` is out (a client disconnecting, a shorter timeout around
//! the call) gives the claim back and the next caller probes. Without it the
//! claim stayed taken and every later call failed at once, forever.

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
        self.guard_single(conn, cfg.timeout, call).await
    }

    /// [`guard`](Self::guard) for a store on one server, whose calls are
    /// bounded by `timeout`.
    pub(crate) async fn guard_single<C, T>(
        &self,
        conn: &C,
        timeout: Duration,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError>
    where
        C: ConnectionLike + Clone + Send,
    {
        self.admit(conn, timeout).await?;
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
        let claim = BreakerProbeClaim(&self.probing);
        let mut conn = conn.clone();
        let probe = timed(timeout, async move {
            conn.req_packed_command(&redis::cmd("PING")).await
        })
        .await;
        drop(claim);
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

/// The right to send the probe; given back when dropped, however the probing
/// future ends (answered, timed out, or dropped by its caller).
struct BreakerProbeClaim<'a>(&'a AtomicBool);

impl Drop for BreakerProbeClaim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use redis::{Cmd, Pipeline, RedisFuture, Value};

    use super::*;

    /// A connection that answers `PONG` or never answers.
    #[derive(Clone)]
    struct Conn {
        answers: bool,
    }

    impl ConnectionLike for Conn {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            let answers = self.answers;
            Box::pin(async move {
                if !answers {
                    std::future::pending::<()>().await;
                }
                Ok(Value::SimpleString("PONG".into()))
            })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a Pipeline,
            _: usize,
            _: usize,
        ) -> RedisFuture<'a, Vec<Value>> {
            Box::pin(std::future::pending())
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    #[tokio::test]
    async fn a_probe_dropped_mid_flight_gives_its_claim_back() {
        let breaker = Breaker::default();
        breaker.record::<()>(&Err(StoreError::Timeout(Duration::from_millis(5))));
        let timeout = Duration::from_secs(60);
        {
            let stalled = Conn { answers: false };
            let mut probe = pin!(breaker.admit(&stalled, timeout));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(probe.as_mut().poll(&mut cx).is_pending(), "the PING is out");
            // Another caller meanwhile fails at once: one probe at a time.
            let other = Conn { answers: true };
            assert!(breaker.admit(&other, timeout).await.is_err());
        } // the probing caller is dropped here, its PING unanswered
        let healthy = Conn { answers: true };
        assert!(
            breaker.admit(&healthy, timeout).await.is_ok(),
            "next caller probes"
        );
        assert!(
            breaker.admit(&healthy, timeout).await.is_ok(),
            "and the breaker is closed"
        );
    }
}
