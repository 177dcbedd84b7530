//! Delay mode, dry run, store failures open or closed, concurrency permits released.

use std::time::{Duration, Instant};

use super::{manual_store, remaining, serve, Broken, Http};
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, StatusCode};
use tokio::io::AsyncWriteExt;
use tower_throttle::key::PeerIp;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[tokio::test]
async fn delay_mode_admits_after_waiting() {
    // The layer sleeps on tokio's clock, in real time; the store decides on
    // a clock that stands still, so each wait is exactly the 300 ms slot
    // however long the requests take (on the system clock, a request
    // stalled past the slot was admitted at once, or not refused).
    let (store, _clock) = manual_store();
    let one_per_300ms = Policy::cell(0, 1, Duration::from_millis(300)).unwrap();
    let patient = ThrottleLayer::new(store.clone(), one_per_300ms)
        .key(tower_throttle::key::Global)
        .prefix("patient")
        .request_info(true)
        .delay_up_to(Duration::from_secs(2));
    let hasty = ThrottleLayer::new(store, one_per_300ms)
        .key(tower_throttle::key::Global)
        .prefix("hasty")
        .request_info(true)
        .delay_up_to(Duration::from_millis(50));
    let app = Router::new()
        .route("/patient", get(remaining).route_layer(patient))
        .route("/hasty", get(remaining).route_layer(hasty));
    let http = Http::new(serve(app).await);

    assert_eq!(http.send("GET", "/patient", &[]).await.status, 200);
    let started = Instant::now();
    let r = http.send("GET", "/patient", &[]).await;
    assert_eq!(r.status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );

    assert_eq!(http.send("GET", "/hasty", &[]).await.status, 200);
    let r = http.send("GET", "/hasty", &[]).await;
    assert_eq!(r.status, 429, "the wait exceeds the bound");
}

#[tokio::test]
async fn dry_run_never_rejects() {
    let (store, _clock) = manual_store();
    let layer = ThrottleLayer::new(
        store,
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .prefix("dry")
    .request_info(true)
    .dry_run();
    let app = Router::new().route("/", get(remaining).route_layer(layer));
    let http = Http::new(serve(app).await);
    assert_eq!(http.send("GET", "/", &[]).await.body, "ok 0");
    for _ in 0..5 {
        let r = http.send("GET", "/", &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "would be limited");
        assert_eq!(r.headers["ratelimit"], "\"default\";r=0;t=60");
    }
}

#[tokio::test]
async fn store_failures_fail_open_or_closed() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let closed = ThrottleLayer::new(Broken { hang: false }, policy);
    let open = ThrottleLayer::new(Broken { hang: false }, policy).fail_open();
    let timeout =
        ThrottleLayer::new(Broken { hang: true }, policy).store_timeout(Duration::from_millis(50));
    let app = Router::new()
        .route("/closed", get(remaining).route_layer(closed))
        .route("/open", get(remaining).route_layer(open))
        .route("/timeout", get(remaining).route_layer(timeout));
    let http = Http::new(serve(app).await);

    let r = http.send("GET", "/closed", &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!r.body.contains("refused"), "no internals leak: {}", r.body);
    for _ in 0..3 {
        let r = http.send("GET", "/open", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unchecked"));
    }
    let started = Instant::now();
    let r = http.send("GET", "/timeout", &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn concurrency_permits_are_released_on_completion_and_cancel() {
    let store = MemoryStore::new();
    let upload = ThrottleLayer::new(store.clone(), Policy::concurrency(1).unwrap())
        .key(PeerIp::new())
        .prefix("upload")
        .request_info(true);
    async fn handler(headers: HeaderMap) -> &'static str {
        if headers.contains_key("x-hold") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "uploaded"
    }
    let app = Router::new().route("/upload", post(handler).route_layer(upload));
    let addr = serve(app).await;
    let http = Http::new(addr);

    // Completed requests give their permit back.
    for _ in 0..3 {
        assert_eq!(http.post("/upload", &[]).await.status, 200);
    }

    // A request in flight holds the permit...
    let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
    held.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\nx-hold: 1\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut denied = false;
    for _ in 0..100 {
        if http.post("/upload", &[]).await.status == 429 {
            denied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(denied, "the held request owns the only permit");

    // ...until the client goes away and the server drops the request.
    drop(held);
    let mut admitted = false;
    for _ in 0..200 {
        if http.post("/upload", &[]).await.status == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(admitted, "the cancelled request released its permit");
}
