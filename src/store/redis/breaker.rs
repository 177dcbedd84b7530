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
//! A server that answers that it serves nothing for a while trips it too:
//! busy with another client's script ([`Outage::Busy`]), loading its data
//! ([`Outage::Loading`]), a replica cut off from its master
//! ([`Outage::MasterDown`]). It answers `PING` with the same error until
//! that is over, so while tripped calls fail at once with that
//! [`StoreError::Unavailable`], and a `PING` goes at most once per store
//! timeout: the store backs off instead of sending every check to a server
//! that refuses them all. Outages in which the server still answers `PING`
//! (out of memory, a read-only replica) do not trip it: every call gets the
//! server's own answer.
//!
//! A server that is down (connection refused) is left to the connection
//! manager's reconnects: nothing is buffered there.
//!
//! One probe at a time is a [`ProbeGate`], shared with the fallback store;
//! what trips it, and for how long, is decided here. Cancellation: the
//! probe's turn is held by a guard, so a caller dropped while its `PING` is
//! out (a client disconnecting, a shorter timeout around the call) gives the
//! turn back and the next caller probes. Without it the turn stayed taken
//! and every later call failed at once, forever.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use tokio::time::Instant;

use super::error::timed;
use super::Config;
use crate::clock::Clock;
use crate::store::probe::{nanos, Probe, ProbeGate};
use crate::store::{Outage, StoreError};

/// The outages that trip the breaker: the server refuses every command,
/// `PING` included, until they pass. Index + 1 is their code in
/// [`Breaker::why`] (0: a timeout).
const TRIPPING: [Outage; 3] = [Outage::Busy, Outage::Loading, Outage::MasterDown];

/// Stops sending to a single server that is unresponsive or refusing
/// everything: see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Breaker {
    /// Open while tripped: with no wait after a timeout or a tripping
    /// answer to a call, for a store timeout after a probe answered with a
    /// tripping outage.
    gate: ProbeGate,
    /// Why it tripped: 0 for a timeout, else 1 + the outage's index in
    /// [`TRIPPING`].
    why: AtomicU8,
    /// What times the wait between probes.
    clock: TokioClock,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            gate: ProbeGate::new(),
            why: AtomicU8::new(0),
            clock: TokioClock(Instant::now()),
        }
    }
}

/// tokio's clock (paused and advanced in tests), as the gate reads time:
/// nanoseconds since the breaker was made, plus one (so that a gate
/// [opened](ProbeGate::open) with no wait lets a probe through at once).
#[derive(Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_ns(&self) -> u64 {
        nanos(Instant::now().saturating_duration_since(self.0)).saturating_add(1)
    }
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

    /// Lets a call through, or fails it at once while the server is
    /// unresponsive or refusing everything.
    async fn admit<C: ConnectionLike + Clone + Send>(
        &self,
        conn: &C,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        // Closed: one atomic load, the clock unread.
        let turn = match self.gate.try_probe(&self.clock) {
            Probe::Closed => return Ok(()),
            Probe::Wait => return Err(self.tripped_error(timeout)),
            Probe::Mine(turn) => turn,
        };
        let mut conn = conn.clone();
        let probe = timed(timeout, async move {
            conn.req_packed_command(&redis::cmd("PING"))
                .await
                .and_then(redis::Value::extract_error)
        })
        .await;
        let answered = match probe {
            Err(StoreError::Unavailable(why)) if TRIPPING.contains(&why) => {
                // Still refusing: back off for a timeout before asking again.
                self.trip(Some(why));
                self.gate.open_for(&self.clock, timeout);
                Err(StoreError::Unavailable(why))
            }
            // Not answered in time: unresponsive now, whatever tripped it.
            Err(e @ StoreError::Timeout(_)) => {
                self.trip(None);
                Err(e)
            }
            // Not answered (a refused connection), or answered that it
            // cannot decide for another reason: still out.
            Err(e) if e.is_unavailable() => Err(e),
            // Any other answer, an error included, is the server serving again.
            Ok(_) | Err(_) => {
                self.gate.close();
                Ok(())
            }
        };
        // The turn goes back after the answer is recorded (and if this
        // future is dropped while the PING is out).
        drop(turn);
        answered
    }

    /// Trips on a timeout or a tripping outage; any other answer from the
    /// server closes it.
    fn record<T>(&self, result: &Result<T, StoreError>) {
        match result {
            Err(StoreError::Timeout(_)) => self.trip(None),
            Err(StoreError::Unavailable(why)) if TRIPPING.contains(why) => self.trip(Some(*why)),
            Ok(_) | Err(StoreError::Script(_) | StoreError::Protocol(_)) => {
                self.gate.close();
            }
            Err(_) => {}
        }
    }

    /// Trips for `why` (`None`: a timeout). A breaker already tripped keeps
    /// its wait before the next probe.
    fn trip(&self, why: Option<Outage>) {
        let code = why
            .and_then(|w| TRIPPING.iter().position(|t| *t == w))
            .map_or(0, |i| i as u8 + 1);
        self.why.store(code, Ordering::Release);
        self.gate.open();
    }

    /// What a call failed at once gets: the reason the breaker tripped.
    fn tripped_error(&self, timeout: Duration) -> StoreError {
        match self.why.load(Ordering::Acquire) {
            0 => StoreError::Timeout(timeout),
            n => StoreError::Unavailable(TRIPPING[usize::from(n - 1)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::sync::Arc;
    use std::task::{Context, Waker};

    use redis::{Cmd, Pipeline, RedisFuture, Value};

    use super::*;

    /// A connection that answers `PONG`, never answers, or answers with the
    /// error `refuses`, counting the commands it was sent.
    #[derive(Clone, Default)]
    struct Conn {
        answers: bool,
        refuses: Option<&'static str>,
        sent: Arc<AtomicUsize>,
    }

    impl Conn {
        fn answering() -> Conn {
            Conn {
                answers: true,
                ..Conn::default()
            }
        }

        fn stalled() -> Conn {
            Conn::default()
        }

        fn refusing(line: &'static str) -> Conn {
            Conn {
                answers: true,
                refuses: Some(line),
                ..Conn::default()
            }
        }

        fn sent(&self) -> usize {
            self.sent.load(Ordering::Relaxed)
        }
    }

    impl ConnectionLike for Conn {
        fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
            let (answers, refuses) = (self.answers, self.refuses);
            self.sent.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                if !answers {
                    std::future::pending::<()>().await;
                }
                if let Some(line) = refuses {
                    return redis::parse_redis_value(format!("-{line}\r\n").as_bytes());
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
            let stalled = Conn::stalled();
            let mut probe = pin!(breaker.admit(&stalled, timeout));
            let mut cx = Context::from_waker(Waker::noop());
            assert!(probe.as_mut().poll(&mut cx).is_pending(), "the PING is out");
            // Another caller meanwhile fails at once: one probe at a time.
            let other = Conn::answering();
            assert!(breaker.admit(&other, timeout).await.is_err());
        } // the probing caller is dropped here, its PING unanswered
        let healthy = Conn::answering();
        assert!(
            breaker.admit(&healthy, timeout).await.is_ok(),
            "next caller probes"
        );
        assert!(
            breaker.admit(&healthy, timeout).await.is_ok(),
            "and the breaker is closed"
        );
    }

    /// A call through the breaker: was it sent, and what came back.
    async fn call(
        breaker: &Breaker,
        conn: &Conn,
        answer: Result<(), StoreError>,
    ) -> (bool, Result<(), StoreError>) {
        let sent = AtomicBool::new(false);
        let r = breaker
            .guard_single(conn, TIMEOUT, async {
                sent.store(true, Ordering::Relaxed);
                answer
            })
            .await;
        (sent.load(Ordering::Relaxed), r)
    }

    const TIMEOUT: Duration = Duration::from_millis(100);

    /// A server refusing every command, PING included, trips the breaker:
    /// calls fail at once with that outage, and it is sent one PING per
    /// store timeout until it answers PONG.
    #[tokio::test(start_paused = true)]
    async fn a_server_refusing_everything_is_pinged_once_per_timeout_not_hammered() {
        let cases = [
            ("BUSY Redis is busy running a script.", Outage::Busy),
            (
                "LOADING Redis is loading the dataset in memory",
                Outage::Loading,
            ),
            ("MASTERDOWN Link with MASTER is down", Outage::MasterDown),
        ];
        for (line, why) in cases {
            let is = |r: &Result<(), StoreError>| matches!(r, Err(StoreError::Unavailable(w)) if *w == why);
            let breaker = Breaker::default();
            let refusing = Conn::refusing(line);
            let (sent, r) = call(&breaker, &refusing, Err(StoreError::Unavailable(why))).await;
            assert!(sent && is(&r));
            for _ in 0..50 {
                let (sent, r) = call(&breaker, &refusing, Ok(())).await;
                assert!(!sent && is(&r), "{line}: failed at once: {r:?}");
            }
            assert_eq!(refusing.sent(), 1, "{line}: one PING, refused");
            tokio::time::advance(TIMEOUT).await;
            for _ in 0..50 {
                let (sent, r) = call(&breaker, &refusing, Ok(())).await;
                assert!(!sent && is(&r), "{line}");
            }
            assert_eq!(refusing.sent(), 2, "{line}: one PING per timeout");
            tokio::time::advance(TIMEOUT).await;
            let served = Conn::answering();
            let (sent, r) = call(&breaker, &served, Ok(())).await;
            assert!(sent && r.is_ok(), "{line}: the PONG closed it");
            assert_eq!(served.sent(), 1);
        }
    }

    /// A call timing out while the breaker waits out a refusal keeps that
    /// wait (no PING before it ends), and calls now fail with the timeout.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_while_waiting_keeps_the_wait() {
        let breaker = Breaker::default();
        let refusing = Conn::refusing("BUSY Redis is busy running a script.");
        let busy = Err(StoreError::Unavailable(Outage::Busy));
        let (sent, r) = call(&breaker, &refusing, busy).await;
        assert!(sent && r.is_err(), "tripped");
        let (sent, r) = call(&breaker, &refusing, Ok(())).await;
        assert!(
            !sent && r.is_err() && refusing.sent() == 1,
            "a refused PING"
        );
        breaker.record::<()>(&Err(StoreError::Timeout(TIMEOUT)));
        tokio::time::advance(TIMEOUT / 2).await;
        let (sent, r) = call(&breaker, &refusing, Ok(())).await;
        assert!(!sent && matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
        assert_eq!(refusing.sent(), 1, "no PING within the wait");
        tokio::time::advance(TIMEOUT / 2).await;
        let served = Conn::answering();
        let (sent, r) = call(&breaker, &served, Ok(())).await;
        assert!(sent && r.is_ok() && served.sent() == 1, "then one PING");
    }

    /// An outage in which the server still answers PING (out of memory, a
    /// replica) does not trip it: every call gets the server's answer.
    #[tokio::test]
    async fn outages_the_server_answers_pings_in_do_not_trip() {
        let breaker = Breaker::default();
        let conn = Conn::answering();
        for why in [Outage::OutOfMemory, Outage::ReadOnly, Outage::ScriptsLost] {
            for _ in 0..3 {
                let (sent, r) = call(&breaker, &conn, Err(StoreError::Unavailable(why))).await;
                assert!(sent && matches!(r, Err(StoreError::Unavailable(w)) if w == why));
            }
        }
        assert_eq!(conn.sent(), 0, "no PING");
    }
}
