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

use crate::faults;
use crate::redis_support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, Policy, Store, ThrottleLayer};

use faults::Paused;
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

/// The leases held on the concurrency route's key (tombstones excluded).
fn leases(server: &RedisServer, store: &RedisStore) -> usize {
    let key = store.redis_key(b"slots:default:*", &slots());
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .expect("ZRANGE");
    members.iter().filter(|m| !m.starts_with(b"x:")).count()
}

/// Probes until the store answers; the time it took.
async fn recovery(store: &RedisStore, fault: &str) -> Duration {
    let start = Instant::now();
    let probe = Policy::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap();
    loop {
        let error = match store.check(Charge::new(b"probe", &probe, 1)).await {
            Ok(_) => return start.elapsed(),
            Err(e) => e,
        };
        assert!(
            start.elapsed() < RECOVERY,
            "after {fault}: no answer {:?} after the server was healthy: {error}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn admin(server: &RedisServer, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query(&mut server.conn()).expect("admin command");
}

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

        // Routes: GCRA per user (fail closed), the same fail open with a
        // layer timeout shorter than the store's, and a concurrency limit.
        let ok = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        });
        let per_user = ThrottleLayer::new(store.clone(), gcra())
            .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
            .prefix("gcra")
            .fail_closed()
            .layer(ok);
        let open = ThrottleLayer::new(store.clone(), gcra())
            .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
            .prefix("open")
            .fail_open()
            .store_timeout(Duration::from_millis(30))
            .layer(ok);
        let held = {
            let tally = tally.clone();
            tower::service_fn(move |_req: Request<()>| {
                let tally = tally.clone();
                async move {
                    let _running = Running::start(tally);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }
            })
        };
        let concurrent = ThrottleLayer::new(store.clone(), slots())
            .key(Global)
            .prefix("slots")
            .fail_closed()
            .layer(held);
        let direct = Arc::new(Limiter::new(store.clone(), log()).with_prefix("direct"));

        let inflight_tasks = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for w in 0..12u64 {
            let (per_user, open, concurrent) = (per_user.clone(), open.clone(), concurrent.clone());
            let (direct, tally, stop) = (direct.clone(), tally.clone(), stop.clone());
            let inflight_tasks = inflight_tasks.clone();
            workers.push(tokio::spawn(async move {
                let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (w + 1));
                let mut sent = 0u64;
                // Bounded in count as well as in time.
                while !stop.load(Ordering::Relaxed) && sent < 20_000 {
                    sent += 1;
                    let user = rng.below(USERS as u64) as usize;
                    // One request in five is cut off at a random point.
                    let cancel_after =
                        (rng.below(5) == 0).then(|| Duration::from_micros(rng.below(4_000)));
                    let route = rng.below(4);
                    let started = Instant::now();
                    inflight_tasks.fetch_add(1, Ordering::SeqCst);
                    let (tally2, per_user, open, concurrent, direct) = (
                        tally.clone(),
                        per_user.clone(),
                        open.clone(),
                        concurrent.clone(),
                        direct.clone(),
                    );
                    let work = async move {
                        match route {
                            0 => {
                                let s = per_user.oneshot(request(user)).await.unwrap().status();
                                if s == StatusCode::OK {
                                    tally2.gcra_admitted[user].fetch_add(1, Ordering::SeqCst);
                                }
                                assert!([200, 429, 503].contains(&s.as_u16()), "fail closed: {s}");
                                ("gcra", s.as_u16())
                            }
                            1 => {
                                let s = open.oneshot(request(user)).await.unwrap().status();
                                assert!([200, 429].contains(&s.as_u16()), "fail open: {s}");
                                ("open", s.as_u16())
                            }
                            2 => {
                                let s = concurrent.oneshot(request(user)).await.unwrap().status();
                                assert!([200, 429, 503].contains(&s.as_u16()), "fail closed: {s}");
                                ("slots", s.as_u16())
                            }
                            _ => match direct.check(format!("user-{user}")).await {
                                Ok(d) if d.allowed => {
                                    tally2.log_admitted[user].fetch_add(1, Ordering::SeqCst);
                                    ("direct", 200)
                                }
                                Ok(_) => ("direct", 429),
                                Err(_) => ("direct", 503),
                            },
                        }
                    };
                    match cancel_after {
                        Some(after) => {
                            if tokio::time::timeout(after, work).await.is_err() {
                                tally.cancelled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => {
                            let (route, status) =
                                tokio::time::timeout(STORE_TIMEOUT + ANSWER_BOUND * 2, work)
                                    .await
                                    .expect("a request was never answered");
                            tally.answered_in(started.elapsed(), route);
                            tally.status(route, status);
                        }
                    }
                    inflight_tasks.fetch_sub(1, Ordering::SeqCst);
                    // Pace the load a little so the machine stays responsive.
                    if sent.is_multiple_of(8) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }));
        }

        // The faults, one after another, until the soak time is up.
        let started = Instant::now();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut recoveries: Vec<(String, Duration)> = Vec::new();
        let mut round = 0;
        while started.elapsed() < SOAK {
            tokio::time::sleep(Duration::from_millis(300 + rng.below(400))).await;
            let fault = match round % 4 {
                0 => {
                    let paused = Paused::pause(&server);
                    tokio::time::sleep(Duration::from_millis(200 + rng.below(800))).await;
                    paused.resume();
                    "SIGSTOP"
                }
                1 => {
                    // The restart blocks (it waits for PING): off the workers.
                    tokio::task::block_in_place(|| server.restart());
                    "kill and restart"
                }
                2 => {
                    admin(&server, &["CLIENT", "KILL", "TYPE", "normal"]);
                    "CLIENT KILL"
                }
                _ => {
                    admin(&server, &["SCRIPT", "FLUSH"]);
                    "SCRIPT FLUSH"
                }
            };
            round += 1;
            recoveries.push((fault.to_owned(), recovery(&store, fault).await));
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.await.expect("a worker panicked");
        }
        assert_eq!(inflight_tasks.load(Ordering::SeqCst), 0);

        // No admission beyond a limit.
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

        // No lease outlives its request once the dust settles.
        let settle = Instant::now();
        while leases(&server, &store) > 0 {
            assert!(
                settle.elapsed() < Duration::from_secs(5),
                "{} leases held after every request ended",
                leases(&server, &store)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

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
    });
}
