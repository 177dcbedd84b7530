//! 429s with headers, isolated users and routes, spoofed headers, missing identities, several rules.

use std::time::Duration;

use super::{auth, manual_store, remaining, reply_layer, serve, ugc_app, Http, UserId};
use axum::middleware::{self};
use axum::routing::{get, post};
use axum::Router;
use http::StatusCode;
use tower_throttle::key::{ClientIp, FromExtension, KeyExtractor, PeerIp};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::{Policy, Rule, ThrottleLayer};

#[tokio::test]
async fn sixth_reply_in_a_minute_is_429_with_headers() {
    let (store, clock) = manual_store();
    let http = Http::new(serve(ugc_app(store)).await);
    let alice = [("x-user", "alice")];
    for left in (0..5).rev() {
        let r = http.post("/reply", &alice).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("ok {left}"));
        assert!(
            r.headers.get("ratelimit").is_none(),
            "headers only on 429 by default"
        );
    }
    clock.advance(Duration::from_millis(200));
    let r = http.post("/reply", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The oldest of the five leaves 59.8 s from now: rounded up.
    assert_eq!(r.headers["retry-after"], "60");
    assert_eq!(r.headers["ratelimit-policy"], "\"default\";q=5;w=60");
    assert_eq!(r.headers["ratelimit"], "\"default\";r=0;t=60");
    assert_eq!(r.headers["x-ratelimit-limit"], "5");
    assert_eq!(r.headers["x-ratelimit-remaining"], "0");
    assert_eq!(r.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(r.body, "Too many requests: try again in 60 s.\n");

    // Denied requests consume nothing: once the five have left the window,
    // five fit again, and a sixth does not.
    clock.advance(Duration::from_millis(59_800));
    for _ in 0..5 {
        assert_eq!(http.post("/reply", &alice).await.status, StatusCode::OK);
    }
    assert_eq!(
        http.post("/reply", &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn users_and_routes_are_isolated() {
    let (store, _clock) = manual_store();
    let http = Http::new(serve(ugc_app(store)).await);
    for _ in 0..5 {
        assert_eq!(
            http.post("/reply", &[("x-user", "alice")]).await.status,
            200
        );
    }
    assert_eq!(
        http.post("/reply", &[("x-user", "alice")]).await.status,
        429
    );
    // Another user on the same route: a fresh quota.
    assert_eq!(http.post("/reply", &[("x-user", "bob")]).await.body, "ok 4");
    // The same user on another route: that route's own quota.
    assert_eq!(
        http.post("/like", &[("x-user", "alice")]).await.body,
        "ok 2"
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_is_ignored() {
    let (store, _clock) = manual_store();
    let policy = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    // Behind a proxy on loopback: the rightmost untrusted hop is the client.
    let proxied = ThrottleLayer::new(store.clone(), policy)
        .key(ClientIp::new().trust("127.0.0.0/8".parse().unwrap()))
        .prefix("proxied")
        .request_info(true);
    // No trusted proxy: the header is never read.
    let direct = ThrottleLayer::new(store, policy)
        .key(ClientIp::new())
        .prefix("direct")
        .request_info(true);
    let app = Router::new()
        .route("/proxied", get(remaining).route_layer(proxied))
        .route("/direct", get(remaining).route_layer(direct));
    let http = Http::new(serve(app).await);
    for i in 0..3 {
        let xff = format!("6.6.6.{i}, 203.0.113.7");
        let r = http
            .send("GET", "/proxied", &[("x-forwarded-for", &xff)])
            .await;
        assert_eq!(r.status, 200, "request {i}");
    }
    let r = http
        .send(
            "GET",
            "/proxied",
            &[("x-forwarded-for", "1.2.3.4, 203.0.113.7")],
        )
        .await;
    assert_eq!(
        r.status, 429,
        "a new spoofed entry does not buy a new quota"
    );
    let r = http
        .send("GET", "/proxied", &[("x-forwarded-for", "203.0.113.8")])
        .await;
    assert_eq!(r.status, 200, "another real client has its own quota");

    for i in 0..3 {
        let xff = format!("198.51.100.{i}");
        let r = http
            .send("GET", "/direct", &[("x-forwarded-for", &xff)])
            .await;
        assert_eq!(r.status, 200);
    }
    let r = http
        .send("GET", "/direct", &[("x-forwarded-for", "9.9.9.9")])
        .await;
    assert_eq!(r.status, 429);
}

#[tokio::test]
async fn missing_identity_is_handled_as_configured() {
    let (store, _clock) = manual_store();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let reject = reply_layer(store.clone()).problem_json_body();
    let skip = ThrottleLayer::new(store.clone(), policy)
        .key(FromExtension::<UserId>::new())
        .prefix("skip")
        .request_info(true)
        .on_missing_key(OnMissingKey::Skip);
    let fallback = ThrottleLayer::new(store, policy)
        .key(FromExtension::<UserId>::new().or(PeerIp::new()))
        .prefix("fallback")
        .request_info(true);
    let app = Router::new()
        .route("/reject", post(remaining).route_layer(reject))
        .route("/skip", post(remaining).route_layer(skip))
        .route("/fallback", post(remaining).route_layer(fallback))
        .layer(middleware::from_fn(auth));
    let http = Http::new(serve(app).await);

    let r = http.post("/reject", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert!(r.body.contains("\"status\":401"), "{}", r.body);
    assert!(r.body.contains("no authenticated identity"), "{}", r.body);

    for _ in 0..3 {
        let r = http.post("/skip", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "Some(NoKey)"));
    }

    assert_eq!(http.post("/fallback", &[]).await.status, 200);
    assert_eq!(
        http.post("/fallback", &[]).await.status,
        429,
        "anonymous: per address"
    );
    assert_eq!(
        http.post("/fallback", &[("x-user", "carol")]).await.status,
        200
    );
}

#[tokio::test]
async fn several_rules_are_all_or_nothing() {
    let (store, clock) = manual_store();
    let layer = ThrottleLayer::new(
        store,
        Policy::sliding_log(2, Duration::from_secs(60)).unwrap(),
    )
    .name("minute")
    .and(Rule::new(
        "day",
        Policy::fixed_window(3, Duration::from_secs(86_400)).unwrap(),
    ))
    .key(FromExtension::<UserId>::new())
    .prefix("reply")
    .request_info(true)
    .headers_on_allowed(true);
    let app = Router::new()
        .route("/reply", post(remaining).route_layer(layer))
        .layer(middleware::from_fn(auth));
    let http = Http::new(serve(app).await);
    let u = [("x-user", "dave")];
    let r = http.post("/reply", &u).await;
    assert_eq!(
        r.headers["ratelimit-policy"],
        "\"minute\";q=2;w=60, \"day\";q=3;w=86400"
    );
    assert_eq!(r.body, "ok 1");
    assert_eq!(http.post("/reply", &u).await.status, 200);
    // The minute rule denies: the day rule is not charged.
    let r = http.post("/reply", &u).await;
    assert_eq!(r.status, 429);
    assert!(r.headers["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"minute\";r=0;t=60, \"day\";r=1;"));
    clock.advance(Duration::from_secs(61));
    assert_eq!(http.post("/reply", &u).await.status, 200);
    // Now the day rule denies, with the longer wait.
    clock.advance(Duration::from_secs(61));
    let r = http.post("/reply", &u).await;
    assert_eq!(r.status, 429);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 3600, "the day window's wait, got {retry}");
}
