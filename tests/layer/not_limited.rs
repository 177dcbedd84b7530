//! Every request a layer with `request_info(true)` forwards carries a
//! `RateLimitInfo`, through a real axum server: those it let through
//! unchecked (`skip_if`, no key under `OnMissingKey::Skip`, a store that
//! failed open) carry one that says why, with no decision and no fields.

use std::time::Duration;

use axum::extract::Extension;
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_throttle::key::HeaderKey;
use tower_throttle::lockout::Penalty;
use tower_throttle::mode::OnMissingKey;
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, Rule, ThrottleLayer};

use crate::http_layer::Broken;
use crate::served::{get as request, serve};

/// Takes the extension itself, not an `Option`: a request without it is a 500.
async fn handler(Extension(info): Extension<RateLimitInfo>) -> String {
    match info.decision() {
        Some(d) => format!("limited, {} left", d.remaining),
        None => format!("{:?}", info.not_limited()),
    }
}

fn minute(max: u64) -> Policy {
    Policy::fixed_window(max, Duration::from_secs(60)).unwrap()
}

/// Checks `/` and `/health` (skipped) behind `layer`, with and without the
/// `x-user` key: unchecked requests say why and carry no fields.
async fn check(layer: ThrottleLayer<MemoryStore>, what: &str) {
    let layer = layer
        .request_info(true)
        .headers_on_allowed(true)
        .skip_if(|req| req.uri().path() == "/health");
    let app = Router::new()
        .route("/", get(handler))
        .route("/health", get(handler))
        .layer(layer);
    let addr = serve(app, true).await;
    let user = [("x-user", "ann")];
    for (path, headers, said) in [
        ("/health", &user[..], "Some(Skipped)"),
        ("/health", &[][..], "Some(Skipped)"),
        ("/", &[][..], "Some(NoKey)"),
    ] {
        let (status, fields, body) = request(addr, path, headers).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, said),
            "{what} {path}"
        );
        assert!(
            !fields.contains_key("ratelimit") && !fields.contains_key("ratelimit-policy"),
            "{what}: an unchecked request gets no fields: {fields:?}"
        );
    }
    let (status, fields, body) = request(addr, "/", &user).await;
    assert_eq!(status, StatusCode::OK, "{what}");
    assert!(body.starts_with("limited, "), "{what}: {body}");
    assert!(fields.contains_key("ratelimit"), "{what}: {fields:?}");
}

fn by_user() -> HeaderKey {
    HeaderKey::new(http::HeaderName::from_static("x-user"))
}

#[tokio::test]
async fn skipped_and_keyless_requests_say_so_behind_every_kind_of_layer() {
    let one = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .key(by_user())
        .on_missing_key(OnMissingKey::Skip);
    check(one, "one rule").await;

    // Two rules, neither with a key: the request as a whole is unchecked.
    let two = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .key(by_user())
        .and(
            Rule::new("tenant", minute(100))
                .key(HeaderKey::new(http::HeaderName::from_static("x-tenant"))),
        )
        .on_missing_key(OnMissingKey::Skip);
    check(two, "two rules").await;

    let penalty = Penalty::new(3, Duration::from_secs(600), Duration::from_secs(3600)).unwrap();
    let locking = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .key(by_user())
        .lockout(penalty)
        .on_missing_key(OnMissingKey::Skip);
    check(locking, "lock-out").await;
}

#[tokio::test]
async fn a_rule_without_its_key_is_absent_from_a_checked_request() {
    let layer = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .key(by_user())
        .and(
            Rule::new("tenant", minute(100))
                .key(HeaderKey::new(http::HeaderName::from_static("x-tenant"))),
        )
        .on_missing_key(OnMissingKey::Skip)
        .request_info(true);
    let app = Router::new()
        .route(
            "/",
            get(|Extension(info): Extension<RateLimitInfo>| async move {
                let names: Vec<&str> = info.iter().map(|(name, _, _)| name).collect();
                format!("{} {names:?}", info.is_limited())
            }),
        )
        .layer(layer);
    let addr = serve(app, true).await;
    let (status, _, body) = request(addr, "/", &[("x-user", "ann")]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "true [\"default\"]")
    );
}

#[tokio::test]
async fn a_store_that_failed_open_says_so() {
    let layer = ThrottleLayer::new(Broken { hang: false }, minute(10))
        .fail_open()
        .request_info(true);
    let app = Router::new().route("/", get(handler)).layer(layer);
    let addr = serve(app, true).await;
    let (status, _, body) = request(addr, "/", &[]).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "Some(StoreFailed)")
    );
}

#[tokio::test]
async fn a_missing_extension_names_a_public_path() {
    // The path axum prints is one a user can write.
    let printed = std::any::type_name::<tower_throttle::info::RateLimitInfo>();
    assert_eq!(printed, "tower_throttle::info::RateLimitInfo");
    // Without `request_info(true)` the handler's extractor fails, naming it.
    let layer = ThrottleLayer::new(MemoryStore::new(), minute(10)).key(by_user());
    let app = Router::new().route("/", get(handler)).layer(layer);
    let addr = serve(app, true).await;
    let (status, _, body) = request(addr, "/", &[("x-user", "ann")]).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains(printed), "{body}");
}

#[tokio::test]
async fn nested_layers_show_the_innermost_that_checked() {
    let outer = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .name("outer")
        .prefix("outer")
        .key(by_user())
        .request_info(true)
        .skip_if(|req| req.uri().path() == "/both-skip");
    let inner = ThrottleLayer::new(MemoryStore::new(), minute(10))
        .name("inner")
        .prefix("inner")
        .key(by_user())
        .request_info(true)
        .skip_if(|req| req.uri().path() != "/inner");
    let named = |Extension(info): Extension<RateLimitInfo>| async move {
        match info.iter().next() {
            Some((name, _, _)) => name.to_owned(),
            None => format!("{:?}", info.not_limited()),
        }
    };
    let app = Router::new()
        .route("/inner", get(named))
        .route("/outer", get(named))
        .route("/both-skip", get(named))
        .layer(inner)
        .layer(outer);
    let addr = serve(app, true).await;
    let user = [("x-user", "ann")];
    for (path, seen) in [
        ("/inner", "inner"),
        // The inner layer skipped: the outer layer's decision stays.
        ("/outer", "outer"),
        ("/both-skip", "Some(Skipped)"),
    ] {
        let (status, _, body) = request(addr, path, &user).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, seen), "{path}");
    }
}
