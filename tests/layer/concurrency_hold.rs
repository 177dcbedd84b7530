//! Concurrency denials on tokio's paused clock: an honest `Retry-After`
//! (the observed hold time, not the lease), and delay mode woken by the
//! release of a permit rather than by a timer.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{header::RETRY_AFTER, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{service_fn, Layer, ServiceExt};
use tower_throttle::key::Global;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

use crate::counting_store;
use counting_store::CountingStore;

use crate::tokio_clock;
use tokio_clock::{tokio_store, TokioClock};

fn store() -> MemoryStore<TokioClock> {
    tokio_store()
}

async fn ok(_: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn retry_after<B>(r: &Response<B>) -> Option<&str> {
    r.headers().get(RETRY_AFTER).map(|v| v.to_str().unwrap())
}

/// The `t` of the `RateLimit` field's one item.
fn t<B>(r: &Response<B>) -> &str {
    let field = r.headers()["ratelimit"].to_str().unwrap();
    let (_, t) = field.rsplit_once(";t=").expect(field);
    t
}

/// Uploads that hold their permit 3 s: a denial says 3, not the 60 s lease.
#[tokio::test(start_paused = true)]
async fn retry_after_is_the_observed_hold_time_not_the_lease() {
    let svc = ThrottleLayer::new(store(), Policy::concurrency(1).unwrap())
        .key(Global)
        .layer(service_fn(ok));
    // Before any release: the floor, 1 s.
    let held = svc.clone().oneshot(Request::new(())).await.unwrap();
    let denied = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&denied), Some("1"));
    // `t` follows the estimate too: `Retry-After` is never earlier than it.
    assert_eq!(t(&denied), "1");
    // Released at once: a hold time of ~0, which the next ones outweigh.
    drop(held);
    for _ in 0..8 {
        let upload = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(upload.status(), StatusCode::OK);
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(upload);
    }
    let _held = svc.clone().oneshot(Request::new(())).await.unwrap();
    let denied = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&denied), Some("3"));
    assert_eq!(t(&denied), "3");
}

/// The estimate never exceeds the store's bound: with a 2 s lease and 3 s
/// holds (the lease lapses first), the lease is the honest answer.
#[tokio::test(start_paused = true)]
async fn the_estimate_is_capped_by_the_lease() {
    let policy = Policy::concurrency_with_lease(1, Duration::from_secs(2)).unwrap();
    let svc = ThrottleLayer::new(store(), policy)
        .key(Global)
        .layer(service_fn(ok));
    let upload = svc.clone().oneshot(Request::new(())).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(upload);
    let _held = svc.clone().oneshot(Request::new(())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let denied = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        retry_after(&denied),
        Some("2"),
        "1.5 s left on the lease, rounded up"
    );
}

/// In delay mode a waiting request is admitted the moment a permit is
/// released, long before its estimate (10 s here) would have woken it.
#[tokio::test(start_paused = true)]
async fn delay_mode_admits_on_release() {
    let svc = ThrottleLayer::new(store(), Policy::concurrency(1).unwrap())
        .key(Global)
        .delay_up_to(Duration::from_secs(30))
        .layer(service_fn(ok));
    // Teach the estimate that permits are held 10 s.
    let first = svc.clone().oneshot(Request::new(())).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    drop(first);
    let holder = svc.clone().oneshot(Request::new(())).await.unwrap();
    let start = tokio::time::Instant::now();
    let waiter = tokio::spawn(svc.clone().oneshot(Request::new(())));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!waiter.is_finished(), "waits while the permit is held");
    // Reading the body to its end releases the permit.
    holder.into_body().collect().await.unwrap();
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let waited = start.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "woken by the release, waited {waited:?}"
    );
}

/// Without a release the estimate is the fallback: the waiter re-checks
/// when it runs out and is admitted once the holder's lease lapses.
#[tokio::test(start_paused = true)]
async fn delay_mode_falls_back_to_the_estimate_and_the_lease() {
    let policy = Policy::concurrency_with_lease(1, Duration::from_secs(3)).unwrap();
    let svc = ThrottleLayer::new(store(), policy)
        .key(Global)
        .delay_up_to(Duration::from_secs(10))
        .layer(service_fn(ok));
    // A holder that never releases (leaked): only its lease frees the key.
    std::mem::forget(svc.clone().oneshot(Request::new(())).await.unwrap());
    let start = tokio::time::Instant::now();
    let admitted = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(5),
        "waited {waited:?}"
    );
}

/// A release wakes the waiters of its own key, not every waiter of the
/// layer: user b waits 5 s for its permit while user a's twenty requests
/// come and go, and b's waiter checks the store only when its estimate runs
/// out and when b's permit is released. Woken by every release, it checked
/// again after each of a's twenty.
#[tokio::test(start_paused = true)]
async fn a_release_wakes_only_the_waiters_of_its_key() {
    let store = CountingStore::new(store());
    let calls = store.calls.clone();
    let user = http::HeaderName::from_static("x-user");
    let svc = ThrottleLayer::new(store, Policy::concurrency(1).unwrap())
        .key(tower_throttle::key::HeaderKey::new(user.clone()))
        .delay_up_to(Duration::from_secs(30))
        .layer(service_fn(ok));
    let request = |who: &str| Request::builder().header(&user, who).body(()).unwrap();
    let holder = svc.clone().oneshot(request("b")).await.unwrap();
    let start = tokio::time::Instant::now();
    let waiter = tokio::spawn(svc.clone().oneshot(request("b")));
    for _ in 0..20 {
        let upload = svc.clone().oneshot(request("a")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(upload);
    }
    tokio::time::sleep(Duration::from_secs(5) - start.elapsed()).await;
    assert!(!waiter.is_finished(), "b's permit is still held");
    drop(holder);
    let admitted = waiter.await.unwrap().unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert!(
        start.elapsed() < Duration::from_millis(5_100),
        "{:?}",
        start.elapsed()
    );
    let checks_of_b: usize = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(key, _)| key.ends_with(b":b"))
        .map(|(_, n)| n)
        .sum();
    // The holder's, the waiter's first, one per second of estimate (the
    // floor, 1 s) and the one after the release: 7; twenty more before.
    assert!(checks_of_b <= 8, "{checks_of_b} checks of b");
}
