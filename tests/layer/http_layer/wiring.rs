//! The layer in `ServiceBuilder` and `Router::layer`, composed extractors, matched path and cost.

use std::time::Duration;

use super::{manual_store, remaining, serve, Http, UserId};
use axum::routing::{get, post};
use axum::Router;
use tower_throttle::key::{FromExtension, KeyExtractor, PeerIp};
use tower_throttle::{Policy, ThrottleLayer};

#[tokio::test]
async fn layer_works_in_service_builder_and_router_layer() {
    let (store, _clock) = manual_store();
    let global = ThrottleLayer::new(
        store,
        Policy::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .key(PeerIp::new())
    .prefix("global")
    .request_info(true);
    let app = Router::new()
        .route("/a", get(remaining))
        .route("/b", get(remaining))
        .layer(tower::ServiceBuilder::new().layer(global));
    let http = Http::new(serve(app).await);
    assert_eq!(http.send("GET", "/a", &[]).await.status, 200);
    assert_eq!(http.send("GET", "/b", &[]).await.status, 200);
    assert_eq!(
        http.send("GET", "/a", &[]).await.status,
        429,
        "one counter across routes"
    );
}

#[test]
fn key_extractors_compose() {
    fn assert_extractor(_: impl KeyExtractor) {}
    assert_extractor((PeerIp::new(), FromExtension::<UserId>::new()).or(PeerIp::new()));
}

#[tokio::test]
async fn matched_path_and_request_cost() {
    let (store, _clock) = manual_store();
    // One bucket per route template, whatever the id; a request costs its `x-items`.
    let layer = ThrottleLayer::new(
        store,
        Policy::fixed_window(5, Duration::from_secs(60)).unwrap(),
    )
    .key(tower_throttle::key::MatchedPathKey)
    .request_info(true)
    .cost_fn(|req| {
        req.headers()
            .get("x-items")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let app = Router::new()
        .route("/items/{id}", post(remaining))
        .route("/other", post(remaining))
        .layer(layer);
    let http = Http::new(serve(app).await);
    assert_eq!(
        http.post("/items/1", &[("x-items", "3")]).await.body,
        "ok 2"
    );
    assert_eq!(http.post("/items/2", &[]).await.body, "ok 1");
    let r = http.post("/items/3", &[("x-items", "2")]).await;
    assert_eq!(r.status, 429, "3 + 1 + 2 > 5 across ids of one route");
    assert_eq!(
        http.post("/items/4", &[]).await.body,
        "ok 0",
        "the denied cost was not charged"
    );
    assert_eq!(http.post("/other", &[]).await.body, "ok 4");
    let r = http.post("/other", &[("x-items", "6")]).await;
    assert_eq!(r.status, 429);
    assert!(
        r.headers.get("retry-after").is_none(),
        "6 > 5 can never be admitted"
    );
}
