//! The layer as a plain tower service: readiness, cancellation, and delay
//! mode on tokio's paused clock.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::Global;
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, ThrottleLayer};

use crate::counting_store;
use counting_store::CountingStore;

use crate::tokio_clock;
use tokio_clock::tokio_store;

#[derive(Clone)]
struct Counting {
    calls: Arc<AtomicUsize>,
    hold: Option<Duration>,
}

impl Service<Request<()>> for Counting {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hold = self.hold;
        let remaining = req
            .extensions()
            .get::<RateLimitInfo>()
            .and_then(|i| i.decision())
            .map(|d| d.remaining);
        Box::pin(async move {
            if let Some(hold) = hold {
                tokio::time::sleep(hold).await;
            }
            Ok(Response::new(Full::new(Bytes::from(format!(
                "{remaining:?}"
            )))))
        })
    }
}

fn counting(hold: Option<Duration>) -> (Counting, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    (
        Counting {
            calls: calls.clone(),
            hold,
        },
        calls,
    )
}

/// A store on a clock that stands still: a minute boundary mid-test would
/// open a new fixed window and admit requests asserted limited.
fn frozen_store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

fn request() -> Request<()> {
    let mut req = Request::new(());
    req.extensions_mut()
        .insert("192.0.2.1:1234".parse::<SocketAddr>().unwrap());
    req
}

#[tokio::test]
async fn rejected_requests_never_reach_the_inner_service() {
    let (inner, calls) = counting(None);
    let layer = ThrottleLayer::new(
        frozen_store(),
        Policy::fixed_window(2, Duration::from_secs(60)).unwrap(),
    );
    let svc = layer.layer(inner);
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(svc.clone().oneshot(request()).await.unwrap().status());
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// Never ready.
#[derive(Clone)]
struct Busy;

impl Service<Request<()>> for Busy {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Pending
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        unreachable!("never ready")
    }
}

#[test]
fn poll_ready_is_the_inner_services() {
    let layer = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    );
    let mut busy = layer.layer(Busy);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    assert!(busy.poll_ready(&mut cx).is_pending());
    let (inner, _) = counting(None);
    let mut ready = layer.layer(inner);
    assert!(matches!(ready.poll_ready(&mut cx), Poll::Ready(Ok(()))));
}

#[tokio::test]
async fn dropped_futures_release_concurrency_permits() {
    let store = MemoryStore::new();
    let policy = Policy::concurrency(2).unwrap();
    let (inner, calls) = counting(Some(Duration::from_secs(3600)));
    let svc = ThrottleLayer::new(store.clone(), policy).layer(inner);
    let first = tokio::spawn(svc.clone().oneshot(request()));
    let second = tokio::spawn(svc.clone().oneshot(request()));
    for _ in 0..1000 {
        if calls.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let third = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let permits = tower_throttle::Limiter::new(store, policy);
    assert_eq!(
        permits.peek("default:192.0.2.1").await.unwrap().remaining,
        0
    );
    first.abort();
    second.abort();
    let _ = (first.await, second.await);
    // Both permits are back.
    assert_eq!(
        permits.peek("default:192.0.2.1").await.unwrap().remaining,
        2
    );
}

#[tokio::test(start_paused = true)]
async fn delay_mode_waits_for_the_slot_within_the_bound() {
    let store = tokio_store();
    // One request per second; waiting requests may wait up to 3 s.
    let layer = ThrottleLayer::new(store, Policy::cell(0, 1, Duration::from_secs(1)).unwrap())
        .key(Global)
        .delay_up_to(Duration::from_secs(3));
    let (inner, calls) = counting(None);
    let svc = layer.layer(inner);
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let status = svc.oneshot(request()).await.unwrap().status();
                (status, start.elapsed())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut rejected = 0;
    for t in tasks {
        let (status, at) = t.await.unwrap();
        if status == StatusCode::OK {
            admitted.push(at);
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            rejected += 1;
        }
    }
    admitted.sort();
    // At most one per second: at 0, 1, 2 and 3 s; the fifth would wait 4 s.
    assert_eq!(
        admitted,
        [0, 1, 2, 3].map(Duration::from_secs),
        "admitted at {admitted:?}"
    );
    assert_eq!(rejected, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

async fn body_of(
    svc: impl Service<
        Request<()>,
        Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>,
        Error = Infallible,
    >,
) -> String {
    use http_body_util::BodyExt;
    let response = svc.oneshot(request()).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn request_info_reaches_handlers_only_when_turned_on() {
    let policy = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let (inner, _) = counting(None);
    let with_info = ThrottleLayer::new(frozen_store(), policy)
        .request_info(true)
        .layer(inner.clone());
    assert_eq!(body_of(with_info).await, "Some(2)");
    // Off by default.
    let without = ThrottleLayer::new(frozen_store(), policy).layer(inner);
    assert_eq!(body_of(without.clone()).await, "None");
    // Limiting itself is unaffected.
    for _ in 0..2 {
        assert_eq!(body_of(without.clone()).await, "None");
    }
    let status = without.oneshot(request()).await.unwrap().status();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

/// GCRA waiters reserve distinct slots: one store call each, no stampede of
/// re-checks when the quota returns, and a request that cannot get a slot
/// within the bound is refused at once rather than after waiting.
#[tokio::test(start_paused = true)]
async fn delay_mode_reserves_gcra_slots_without_rechecking() {
    let store = CountingStore::new(tokio_store());
    let calls_seen = store.calls.clone();
    // Bursts of 2, then one every 500 ms; waiting up to 2 s.
    let layer = ThrottleLayer::new(store, Policy::cell(1, 2, Duration::from_secs(1)).unwrap())
        .key(Global)
        .headers_on_allowed(true)
        .delay_up_to(Duration::from_secs(2));
    let (inner, calls) = counting(None);
    let svc = layer.layer(inner);
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let response = svc.oneshot(request()).await.unwrap();
                (response.status(), start.elapsed())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut rejected_at = Vec::new();
    for t in tasks {
        let (status, at) = t.await.unwrap();
        match status {
            StatusCode::OK => admitted.push(at),
            StatusCode::TOO_MANY_REQUESTS => rejected_at.push(at),
            other => panic!("unexpected {other}"),
        }
    }
    admitted.sort();
    // Two at once, then one per 500 ms up to the 2 s bound.
    assert_eq!(
        admitted,
        [0, 0, 500, 1000, 1500, 2000].map(Duration::from_millis),
        "admitted at {admitted:?}"
    );
    assert_eq!(rejected_at, [Duration::ZERO; 4], "refused without waiting");
    let checks: usize = calls_seen.lock().unwrap().values().sum();
    assert_eq!(checks, 10, "one store call per request");
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

/// A concurrency permit covers the whole response: it is held while the body
/// is unread (a streamed download is still in flight) and released once the
/// body has been read to its end, or dropped.
#[tokio::test]
async fn concurrency_permits_last_until_the_body_ends() {
    use http_body_util::BodyExt;
    let (inner, _) = counting(None);
    let svc = ThrottleLayer::new(MemoryStore::new(), Policy::concurrency(1).unwrap())
        .key(Global)
        .layer(inner);
    let first = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(
        second.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the first body is not read yet"
    );
    first.into_body().collect().await.unwrap();
    let third = svc.clone().oneshot(request()).await.unwrap();
    assert_eq!(
        third.status(),
        StatusCode::OK,
        "released at the end of the body"
    );
    drop(third);
    let fourth = svc.oneshot(request()).await.unwrap();
    assert_eq!(
        fourth.status(),
        StatusCode::OK,
        "released when the body is dropped"
    );
}

/// A waiter dropped while it waits for its reserved GCRA slot (its client
/// hung up) gives the slot back: later requests are not pushed behind the
/// waiters that left.
#[tokio::test(start_paused = true)]
async fn delay_mode_gives_back_the_slots_of_dropped_waiters() {
    let store = tokio_store();
    // One request per second, no burst; waiting up to 2 s.
    let layer = ThrottleLayer::new(store, Policy::cell(0, 1, Duration::from_secs(1)).unwrap())
        .key(Global)
        .delay_up_to(Duration::from_secs(2));
    let (inner, calls) = counting(None);
    let svc = layer.layer(inner);
    let start = tokio::time::Instant::now();
    assert_eq!(
        svc.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    // Two waiters take the slots at 1 s and 2 s, then hang up.
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    for w in &waiters {
        w.abort();
    }
    for w in waiters {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    // Each waiter gives back its slot less the 100 ms it held it (see
    // `Receipt`), so the next request goes at 1.2 s; without the refunds
    // it would need the slot at 3 s, beyond its 2 s budget, and be refused.
    let status = svc.clone().oneshot(request()).await.unwrap().status();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(1_200));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the dropped waiters never ran"
    );
}
