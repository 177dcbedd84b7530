//! Cancellation against a real, stalled Redis: every future the crate hands
//! out may be dropped at any await point without leaving shared state wrong.
//!
//! Each public future is polled N times (N = 0, 1, 2, …) and dropped while the
//! server is frozen with SIGSTOP, with the breaker tripped or not; the server
//! is then resumed and the store must answer normally within a second. And a
//! concurrency permit whose caller is gone, or whose check ran into a stall,
//! is released: no lease is left once the dust settles.

use crate::faults;
use crate::redis_support;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, Policy, Store, ThrottleLayer};

use faults::Paused;
use redis_support::{runtime, RedisServer};

/// The store timeout of these tests: short, so stalls trip the breaker fast.
const TIMEOUT: Duration = Duration::from_millis(100);
/// How soon after the server is healthy again the store must answer.
const RECOVERY: Duration = Duration::from_secs(1);

/// Polls the inner future at most `polls` times, then drops it.
struct DropAfter<F> {
    inner: Option<Pin<Box<F>>>,
    polls: usize,
}

impl<F: Future> Future for DropAfter<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.polls == 0 {
            self.inner = None;
            return Poll::Ready(());
        }
        self.polls -= 1;
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(());
        };
        if inner.as_mut().poll(cx).is_ready() {
            self.inner = None;
            return Poll::Ready(());
        }
        if self.polls == 0 {
            self.inner = None;
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Runs `fut` for `polls` polls (or 300 ms, whichever comes first), then drops it.
async fn drop_after<F: Future>(fut: F, polls: usize) {
    let limited = DropAfter {
        inner: Some(Box::pin(fut)),
        polls,
    };
    let _ = tokio::time::timeout(Duration::from_millis(300), limited).await;
}

fn gcra() -> Policy {
    Policy::cell(1000, 1000, Duration::from_secs(1)).unwrap()
}

fn window() -> Policy {
    Policy::fixed_window(1000, Duration::from_secs(60)).unwrap()
}

fn pair() -> Policy {
    Policy::concurrency(2).unwrap()
}

async fn store_on(server: &RedisServer, batching: bool) -> RedisStore {
    RedisStore::builder()
        .prefix("cancel")
        .timeout(TIMEOUT)
        .batching(batching)
        .connect(server.url())
        .await
        .expect("connect")
}

/// Checks until one is answered; panics if none is within [`RECOVERY`].
async fn answers_within_recovery(store: &RedisStore, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        match store.check(Charge::new(b"probe", &gcra(), 1)).await {
            Ok(d) => {
                assert!(d.allowed, "{what}: the probe key is never limited");
                return start.elapsed();
            }
            Err(e) => assert!(
                start.elapsed() < RECOVERY,
                "{what}: the store still fails {:?} after the server is healthy: {e}",
                start.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The live leases on a concurrency key (tombstones are not leases).
fn leases(server: &RedisServer, store: &RedisStore, key: &[u8]) -> usize {
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(store.redis_key(key, &pair()))
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .expect("ZRANGE");
    members.iter().filter(|m| !m.starts_with(b"x:")).count()
}

/// Waits (≤ 5 s) until `key` holds no lease; returns how long it took.
async fn no_lease_left(server: &RedisServer, store: &RedisStore, key: &[u8]) -> Duration {
    let start = Instant::now();
    loop {
        let held = leases(server, store, key);
        if held == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{held} leases on {:?} outlived their requests",
            String::from_utf8_lossy(key)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The futures under test, one per public async entry point.
// `LayerCall` reads better than `Layer` among the other calls.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug)]
enum Call {
    Check,
    CheckAll,
    Concurrency,
    Refund,
    Reset,
    Release,
    LimiterCheck,
    LimiterAcquire,
    Layer,
}

const CALLS: [Call; 9] = [
    Call::Check,
    Call::CheckAll,
    Call::Concurrency,
    Call::Refund,
    Call::Reset,
    Call::Release,
    Call::LimiterCheck,
    Call::LimiterAcquire,
    Call::Layer,
];

fn ok_handler() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

fn request() -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert("192.0.2.7:4000".parse::<SocketAddr>().unwrap());
    req
}

/// Builds `call`'s future and drops it after `polls` polls.
async fn run_and_drop(store: &RedisStore, call: Call, polls: usize) {
    let shared = Arc::new(store.clone());
    match call {
        Call::Check => drop_after(store.check(Charge::new(b"k", &gcra(), 1)), polls).await,
        Call::CheckAll => {
            let (g, w) = (gcra(), window());
            let rules = [Charge::new(b"k", &g, 1), Charge::new(b"w", &w, 1)];
            drop_after(store.check_all(&rules), polls).await
        }
        Call::Concurrency => drop_after(store.check(Charge::new(b"c", &pair(), 1)), polls).await,
        Call::Refund => {
            let receipt = Receipt::new(1, 0, None);
            drop_after(store.refund(b"k", &gcra(), &receipt), polls).await
        }
        Call::Reset => drop_after(store.reset(b"w", &window()), polls).await,
        Call::Release => drop_after(store.release(b"c", &pair(), PermitId(7)), polls).await,
        Call::LimiterCheck => {
            let limiter = Limiter::from_shared(shared, gcra());
            drop_after(limiter.check("k"), polls).await
        }
        Call::LimiterAcquire => {
            let limiter = Limiter::from_shared(shared, pair());
            drop_after(limiter.acquire("c"), polls).await
        }
        Call::Layer => {
            let svc = ThrottleLayer::new(store.clone(), pair())
                .prefix("layer")
                .layer(ok_handler());
            drop_after(svc.oneshot(request()), polls).await
        }
    }
}

#[test]
fn every_public_future_dropped_at_every_await_point_leaves_the_store_working() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut slowest = Duration::ZERO;
        for batching in [true, false] {
            let store = store_on(&server, batching).await;
            for call in CALLS {
                for polls in 0..4 {
                    for trip_first in [true, false] {
                        let what = format!(
                            "{call:?} dropped after {polls} polls \
                             (batching {batching}, breaker tripped first {trip_first})"
                        );
                        let paused = Paused::pause(&server);
                        if trip_first {
                            let r = store.check(Charge::new(b"trip", &gcra(), 1)).await;
                            assert!(r.is_err(), "{what}: a frozen server cannot answer");
                        }
                        run_and_drop(&store, call, polls).await;
                        paused.resume();
                        slowest = slowest.max(answers_within_recovery(&store, &what).await);
                    }
                }
            }
        }
        // Whatever concurrency checks were dropped, none holds a lease.
        let store = store_on(&server, true).await;
        no_lease_left(&server, &store, b"c").await;
        no_lease_left(&server, &store, b"layer:default:192.0.2.7").await;
        eprintln!("slowest recovery after resume: {slowest:?}");
    });
}

/// Requests aborted at random points through the layer, on a live server:
/// every permit granted to a request that is gone is released.
#[test]
fn aborted_requests_leak_no_concurrency_lease() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for batching in [true, false] {
            let store = store_on(&server, batching).await;
            let key = format!("aborted-{batching}");
            let handler = tower::service_fn(|_req: Request<()>| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            });
            let svc = ThrottleLayer::new(store.clone(), Policy::concurrency(2).unwrap())
                .key(tower_throttle::key::Global)
                .prefix(&key)
                .layer(handler);
            // Each request lives a random 0–500 µs (around its store call,
            // about 0.2 ms) or 0–25 ms (the handler takes 20 ms), then is
            // cut off wherever it is.
            let mut seed = 0x9e37_79b9_u64;
            let mut aborted = 0;
            for _ in 0..150 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let svc = svc.clone();
                let task = tokio::spawn(async move { svc.oneshot(request()).await });
                let life = if seed.is_multiple_of(2) { 500 } else { 25_000 };
                tokio::time::sleep(Duration::from_micros((seed >> 1) % life)).await;
                if !task.is_finished() {
                    task.abort();
                    aborted += 1;
                }
                let _ = task.await;
            }
            assert!(aborted > 0, "some requests must be cut off mid-flight");
            let full_key = format!("{key}:default:*");
            let settled = no_lease_left(&server, &store, full_key.as_bytes()).await;
            eprintln!("batching {batching}: {aborted} of 150 aborted, leases gone in {settled:?}");
            // And the key admits its two in-flight requests again.
            let limiter = Limiter::new(store.clone(), Policy::concurrency(2).unwrap());
            let a = limiter.acquire(&full_key).await.unwrap();
            let b = limiter.acquire(&full_key).await.unwrap();
            assert!(a.is_ok() && b.is_ok(), "both permits are free again");
        }
    });
}

/// Checks that reach Redis during a stall and time out: the store cannot
/// know whether they ran, so it releases their permits once Redis is back
/// (with tombstones for checks still on their way).
#[test]
fn a_stall_leaks_no_concurrency_lease() {
    let server = RedisServer::start();
    runtime().block_on(async {
        for batching in [true, false] {
            let store = store_on(&server, batching).await;
            let key = format!("stall-{batching}");
            // Warm the connection so the checks below really go out.
            assert!(store.check(Charge::new(b"warm", &gcra(), 1)).await.is_ok());
            let paused = Paused::pause(&server);
            let mut tasks = Vec::new();
            for _ in 0..10 {
                let (store, key) = (store.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    store.check(Charge::new(key.as_bytes(), &pair(), 1)).await
                }));
            }
            for t in tasks {
                let r = t.await.unwrap();
                assert!(r.is_err(), "a frozen server answers nothing: {r:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            paused.resume();
            answers_within_recovery(&store, "after the stall").await;
            let settled = no_lease_left(&server, &store, key.as_bytes()).await;
            eprintln!("batching {batching}: leases gone {settled:?} after recovery");
            let a = store
                .check(Charge::new(key.as_bytes(), &pair(), 1))
                .await
                .unwrap();
            let b = store
                .check(Charge::new(key.as_bytes(), &pair(), 1))
                .await
                .unwrap();
            assert!(a.allowed && b.allowed, "both permits are free again");
        }
    });
}
