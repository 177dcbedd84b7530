//! A bounded fault soak (≈30 s): the layer and the direct API under load on
//! one real Redis while faults follow one another — SIGSTOP, kill and
//! restart, `CLIENT KILL`, `SCRIPT FLUSH` — and clients cancel requests at
//! random points, some through a layer store timeout shorter than the
//! store's own.
//!
//! Invariants:
//! * every request that is not cancelled on purpose is answered within its
//!   bound (the store timeout plus scheduling slack), per fail mode: 200, 429
//!   or 503 when closed, 200 or 429 when open;
//! * never more admissions than a limit allows (the server persists every
//!   write with `appendfsync always`, so a restart loses no admission);
//! * never more requests in flight than a concurrency limit;
//! * the store answers within a second of the server being healthy again;
//! * no lease is held once every request has ended.

use crate::redis_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Request;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::Policy;

use redis_support::{runtime, RedisServer};

const STORE_TIMEOUT: Duration = Duration::from_millis(100);
/// What a request may take beyond the store timeout on a loaded 2-core CI.
const ANSWER_BOUND: Duration = Duration::from_secs(1);
const RECOVERY: Duration = Duration::from_secs(1);
const USERS: usize = 4;
/// GCRA burst per user: 100 at once, then one an hour (none in this test).
const GCRA_LIMIT: u64 = 100;
/// Sliding log per user, direct API.
const LOG_LIMIT: u64 = 100;
const IN_FLIGHT: u64 = 3;
const SOAK: Duration = Duration::from_secs(24);

fn gcra() -> Policy {
    Policy::cell(GCRA_LIMIT - 1, 1, Duration::from_secs(3600)).unwrap()
}

fn log() -> Policy {
    Policy::sliding_log(LOG_LIMIT, Duration::from_secs(3600)).unwrap()
}

fn slots() -> Policy {
    Policy::concurrency(IN_FLIGHT).unwrap()
}

/// A tiny deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Tally {
    /// (route, status) → count, for the report.
    statuses: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Admissions per GCRA user (fail-closed layer) and per log user (direct).
    gcra_admitted: [AtomicU64; USERS],
    log_admitted: [AtomicU64; USERS],
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    cancelled: AtomicU64,
    slowest_ns: AtomicU64,
}

impl Tally {
    fn status(&self, route: &'static str, status: u16) {
        *self
            .statuses
            .lock()
            .unwrap()
            .entry((route, status))
            .or_default() += 1;
    }

    fn answered_in(&self, took: Duration, what: &str) {
        assert!(
            took <= STORE_TIMEOUT + ANSWER_BOUND,
            "{what} took {took:?}: beyond its bound"
        );
        self.slowest_ns
            .fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A handler run, counted in flight until it ends or is dropped (cancelled).
struct Running(Arc<Tally>);

impl Running {
    fn start(tally: Arc<Tally>) -> Running {
        let now = tally.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        tally.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Running(tally)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

fn request(user: usize) -> Request<()> {
    let mut req = Request::builder()
        .header("x-user", format!("user-{user}"))
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert("192.0.2.9:5000".parse::<SocketAddr>().unwrap());
    req
}

mod fault_rounds;
mod load;

#[test]
fn faults_never_break_the_invariants() {
    let mut server = RedisServer::start_with_args(&[
        "--appendonly".into(),
        "yes".into(),
        "--appendfsync".into(),
        "always".into(),
    ]);
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::builder()
            .prefix("soak")
            .timeout(STORE_TIMEOUT)
            .connect(server.url())
            .await
            .expect("connect");
        let tally = Arc::new(Tally::default());
        let stop = Arc::new(AtomicBool::new(false));

        let send = load::routes(&store, &tally);
        let inflight_tasks = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for w in 0..12u64 {
            let (send, tally, stop) = (send.clone(), tally.clone(), stop.clone());
            let inflight_tasks = inflight_tasks.clone();
            workers.push(tokio::spawn(load::worker(
                w,
                send,
                tally,
                stop,
                inflight_tasks,
            )));
        }

        let recoveries = fault_rounds::run(&mut server, &store).await;
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.expect("a worker panicked");
        }
        assert_eq!(inflight_tasks.load(Ordering::SeqCst), 0);

        let max_in_flight = assert_within_limits(&tally);
        let settle = fault_rounds::assert_leases_settle(&server, &store).await;
        assert_progress_and_report(&tally, &recoveries, max_in_flight, settle);
    });
}

/// No admission beyond a limit, and never more in flight than the
/// concurrency limit; the most there were.
fn assert_within_limits(tally: &Tally) -> u64 {
    for user in 0..USERS {
        let g = tally.gcra_admitted[user].load(Ordering::SeqCst);
        let l = tally.log_admitted[user].load(Ordering::SeqCst);
        assert!(
            g <= GCRA_LIMIT,
            "user {user}: {g} GCRA admissions > {GCRA_LIMIT}"
        );
        assert!(
            l <= LOG_LIMIT,
            "user {user}: {l} log admissions > {LOG_LIMIT}"
        );
    }
    let max_in_flight = tally.max_in_flight.load(Ordering::SeqCst);
    assert!(
        max_in_flight <= IN_FLIGHT,
        "{max_in_flight} in flight > {IN_FLIGHT}"
    );
    max_in_flight
}

/// The load got through between faults and every kind of fault ran; the
/// figures for the log.
fn assert_progress_and_report(
    tally: &Tally,
    recoveries: &[(String, Duration)],
    max_in_flight: u64,
    settle: Instant,
) {
    let statuses = tally.statuses.lock().unwrap().clone();
    let admitted: u64 = statuses
        .iter()
        .filter(|((_, s), _)| *s == 200)
        .map(|(_, n)| n)
        .sum();
    assert!(admitted > 0, "the load must get through between faults");
    assert!(
        recoveries.iter().any(|(f, _)| f == "kill and restart"),
        "every kind of fault ran"
    );
    let worst = recoveries.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!(
        "soak: {} faults, worst recovery {worst:?}, {} cancelled, slowest answer {:?}, \
         max in flight {max_in_flight}, leases settled in {:?}",
        recoveries.len(),
        tally.cancelled.load(Ordering::Relaxed),
        Duration::from_nanos(tally.slowest_ns.load(Ordering::Relaxed)),
        settle.elapsed()
    );
    eprintln!("soak statuses: {statuses:?}");
    eprintln!(
        "soak admissions: gcra {:?}, log {:?}",
        tally
            .gcra_admitted
            .each_ref()
            .map(|a| a.load(Ordering::SeqCst)),
        tally
            .log_admitted
            .each_ref()
            .map(|a| a.load(Ordering::SeqCst))
    );
    eprintln!("soak recoveries: {recoveries:?}");
}
