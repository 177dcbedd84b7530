//! Starting without Redis: a `FallbackStore` whose primary connects in the
//! background (`RedisStoreBuilder::connect_lazy`), against a real
//! `redis-server` started after it, or answering but refusing the setup.
//!
//! Asserted: the store is built while nothing listens; the fallback
//! decides until Redis answers, then Redis does (the count lives in Redis),
//! with no 503 across the switch; what needs no server is refused before
//! any traffic; a server refusing the setup is logged once at error level,
//! the fallback keeps deciding, and fixing the server attaches it without a
//! restart. Real time: the server's start is the point, waited for by
//! polling with a deadline.

use crate::capture;
use crate::redis_support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use redis_support::{free_port, runtime, RedisServer};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::body::ThrottleBody;
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::DecidedBy;
use tower_throttle::key::HeaderKey;
use tower_throttle::store::redis::TimeSource;
use tower_throttle::store::Charge;
use tower_throttle::store::{FallbackStore, LazyRedisStore, RedisStore};
use tower_throttle::{
    FailMode, MemoryStore, Policy, RateLimitInfo, Store, StoreError, ThrottleLayer,
};
use tracing::Level;

use capture::Capture;

pub(crate) const LIMIT: u64 = 100_000;
/// How long Redis gets to take over once it answers: the connect retry
/// (≤ 2 s) plus the fallback's probe interval (1 s), with room to spare.
pub(crate) const TAKE_OVER: Duration = Duration::from_secs(10);

pub(crate) type Res = Response<ThrottleBody<Empty<Bytes>>>;

pub(crate) fn policy() -> Policy {
    Policy::fixed_window(LIMIT, Duration::from_secs(86_400)).unwrap()
}

pub(crate) fn lazy(url: &str) -> LazyRedisStore {
    lazy_on(url, TimeSource::Server)
}

fn lazy_on(url: &str, time: TimeSource) -> LazyRedisStore {
    RedisStore::builder()
        .prefix("lazy")
        .timeout(Duration::from_millis(200))
        .time_source(time)
        .connect_lazy(url)
        .unwrap()
}

/// A fail-closed layer on `store`, keyed by `x-user` (keys `up:n:<user>`),
/// whose responses carry who decided.
pub(crate) fn service<St: Store>(
    store: St,
) -> impl Service<Request<()>, Response = Res, Error = Infallible, Future = impl Send> + Clone + Send
{
    let layer = ThrottleLayer::new(store, policy())
        .name("n")
        .prefix("up")
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .fail_mode(FailMode::Closed)
        .request_info(true);
    ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(|req: Request<()>| async move {
            let mut res = Response::new(Empty::<Bytes>::new());
            if let Some(info) = req.extensions().get::<RateLimitInfo>() {
                res.extensions_mut().insert(info.decided_by());
            }
            Ok::<_, Infallible>(res)
        }))
}

/// One request as user `u`: its status and who decided.
pub(crate) async fn request<S>(svc: &S) -> (StatusCode, Option<DecidedBy>)
where
    S: Service<Request<()>, Response = Res, Error = Infallible> + Clone,
{
    let req = Request::builder().header("x-user", "u").body(()).unwrap();
    let res = svc.clone().oneshot(req).await.unwrap();
    (res.status(), res.extensions().get::<DecidedBy>().copied())
}

/// Requests until `done`, each answered 200 by the fallback, within
/// [`TAKE_OVER`] (`what` names the awaited event).
pub(crate) async fn on_fallback_until<S>(svc: &S, what: &str, mut done: impl FnMut() -> bool)
where
    S: Service<Request<()>, Response = Res, Error = Infallible> + Clone,
{
    let deadline = Instant::now() + TAKE_OVER;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {TAKE_OVER:?}"
        );
        assert_eq!(
            request(svc).await,
            (StatusCode::OK, Some(DecidedBy::Fallback))
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Requests, each answered 200, until Redis decides one, within [`TAKE_OVER`].
pub(crate) async fn until_redis_decides<S>(svc: &S)
where
    S: Service<Request<()>, Response = Res, Error = Infallible> + Clone,
{
    let deadline = Instant::now() + TAKE_OVER;
    loop {
        let (status, by) = request(svc).await;
        assert_eq!(status, StatusCode::OK);
        if by == Some(DecidedBy::Primary) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Redis did not decide within {TAKE_OVER:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn starts_without_redis_and_moves_to_it_once_it_answers_without_503s() {
    let capture = Capture::install();
    let port = free_port(false);
    let url = format!("redis://127.0.0.1:{port}/");
    let addr = format!("addr=127.0.0.1:{port} ");
    // Redis decides on a frozen clock: on the server's, a day boundary
    // mid-test would split its count over two fixed windows.
    let frozen = || TimeSource::client(ManualClock::new());
    runtime().block_on(async {
        let primary = lazy_on(&url, frozen());
        let store = FallbackStore::new(primary.clone(), MemoryStore::new());
        let svc = service(Arc::new(store.clone()));
        // Until a connect attempt has failed (and said so), the fallback decides.
        on_fallback_until(&svc, "a failure logged", || {
            capture.count_all(Level::WARN, &["cannot reach Redis", &addr]) > 0
        })
        .await;
        assert!(!primary.is_connected());

        // Load across the server's start, then until Redis decides.
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn({
            let (svc, stop) = (svc.clone(), stop.clone());
            async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.push(request(&svc).await);
                    // Pacing only, not synchronisation.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            }
        });
        let server = tokio::task::spawn_blocking(move || RedisServer::start_on(port, &[]))
            .await
            .unwrap();
        until_redis_decides(&svc).await;
        stop.store(true, Ordering::Relaxed);
        let mut seen = load.await.unwrap();
        for _ in 0..5 {
            seen.push(request(&svc).await);
        }
        assert!(
            seen.iter().all(|(status, _)| *status == StatusCode::OK),
            "not all 200: {:?}",
            seen.iter()
                .filter(|(s, _)| *s != StatusCode::OK)
                .collect::<Vec<_>>()
        );
        let last = seen.last().unwrap();
        assert_eq!(last.1, Some(DecidedBy::Primary));
        assert!(primary.is_connected() && !store.is_on_fallback());

        // The count lives in Redis: another instance sees every admission
        // Redis decided (plus the one of the poll that found it deciding).
        let by_redis = seen
            .iter()
            .filter(|(_, by)| *by == Some(DecidedBy::Primary))
            .count() as u64
            + 1;
        let other = RedisStore::builder()
            .prefix("lazy")
            .time_source(frozen())
            .connect(server.url())
            .await
            .unwrap();
        let p = policy();
        let peek = other.check(Charge::new(b"up:n:u", &p, 0)).await.unwrap();
        assert_eq!(LIMIT - peek.remaining, by_redis);
    });
    assert_eq!(
        capture.count_all(Level::WARN, &["cannot reach Redis", &addr]),
        1,
        "the unreachable server is logged once, however many attempts:\n{}",
        capture.dump()
    );
    assert_eq!(
        capture.count_all(Level::WARN, &["connected to Redis at last", &addr]),
        1
    );
}

#[test]
fn with_redis_up_at_start_redis_decides_from_the_first_probe_on() {
    let capture = Capture::install();
    let server = RedisServer::start();
    let addr = format!("addr=127.0.0.1:{} ", server.port);
    runtime().block_on(async {
        let store = FallbackStore::new(lazy(&server.url()), MemoryStore::new());
        until_redis_decides(&service(store)).await;
    });
    let connected = ["connected to Redis: the rate-limit store decides", &addr];
    assert_eq!(capture.count_all(Level::INFO, &connected), 1);
}

/// `INFO stats`' `total_connections_received`, through `admin`.
pub(crate) fn connections(admin: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[test]
fn a_server_refusing_the_setup_is_an_error_once_and_the_fallback_decides_until_fixed() {
    let capture = Capture::install();
    let server = RedisServer::start_with_password("sekrit", &[]);
    let addr = format!("addr=127.0.0.1:{} ", server.port);
    let mut admin = server.conn();
    runtime().block_on(async {
        // No password in the URL: every connect fails its preflight.
        let primary = lazy(&server.url());
        let store = FallbackStore::new(primary.clone(), MemoryStore::new());
        let svc = service(store.clone());
        on_fallback_until(&svc, "an error logged", || {
            capture.count_all(Level::ERROR, &["requires a password", &addr]) > 0
        })
        .await;
        // Two more attempts have run (each opens a connection): still one error.
        let after = connections(&mut admin);
        on_fallback_until(&svc, "two more attempts", || {
            connections(&mut admin) >= after + 3
        })
        .await;
        assert_eq!(
            capture.count_all(Level::ERROR, &["requires a password", &addr]),
            1
        );
        // Alone, the store says why it is not connected, as unavailable.
        let p = policy();
        match primary.check(Charge::new(b"k", &p, 1)).await {
            Err(StoreError::Connection(e)) => {
                assert!(e.to_string().contains("requires a password"), "{e}")
            }
            other => panic!("{other:?}"),
        }

        // The server fixed: the next attempt connects, Redis decides.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("")
            .query(&mut admin)
            .unwrap();
        until_redis_decides(&svc).await;
    });
}

#[test]
fn what_needs_no_server_is_refused_before_any_traffic() {
    runtime().block_on(async {
        let bad_url = RedisStore::builder().connect_lazy("redis://127.0.0.1:notaport/");
        assert!(bad_url.is_err(), "{bad_url:?}");
        let bad_prefix = RedisStore::builder()
            .prefix("a{b}")
            .connect_lazy("redis://127.0.0.1:1/");
        assert!(
            matches!(bad_prefix, Err(StoreError::InvalidRequest(_))),
            "{bad_prefix:?}"
        );
        // Nothing listens: the rules are still checked as Redis would.
        let url = format!("redis://127.0.0.1:{}/", free_port(false));
        let store = FallbackStore::new(lazy(&url), MemoryStore::new());
        let too_long = Policy::sliding_log(10_001, Duration::from_secs(60)).unwrap();
        let err = ThrottleLayer::new(store.clone(), too_long)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("above 10,000"), "{err}");
        ThrottleLayer::new(store, policy()).validate().unwrap();
    });
}
