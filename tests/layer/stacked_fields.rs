//! Two stacked layers (a per-route one inside a per-service one) send one
//! `RateLimit` and one `RateLimit-Policy` field line each, holding both
//! layers' items (some clients read only the first line), parsed with the
//! `sfv` crate (RFC 9651) as a client would.

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

fn names(line: &str) -> Vec<String> {
    let list = sfv::Parser::new(line)
        .parse::<sfv::List>()
        .expect("an RFC 9651 list");
    list.iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => item.bare_item.as_string().expect("a name").to_string(),
            sfv::ListEntry::InnerList(_) => panic!("an inner list"),
        })
        .collect()
}

#[tokio::test]
async fn stacked_layers_send_one_line_per_field_with_every_item() {
    let user = || HeaderKey::new(http::HeaderName::from_static("x-user"));
    let minute = |n| Policy::fixed_window(n, Duration::from_secs(60)).unwrap();
    let service = ThrottleLayer::new(MemoryStore::new(), minute(100))
        .name("service")
        .prefix("service")
        .key(user())
        .headers_on_allowed(true);
    let route = ThrottleLayer::new(MemoryStore::new(), minute(1))
        .name("reply")
        .prefix("reply")
        .key(user())
        .headers_on_allowed(true);
    let app = Router::new()
        .route("/reply", get(|| async { "ok" }).route_layer(route))
        .layer(service);
    let get = || {
        Request::get("/reply")
            .header("x-user", "ann")
            .body(Body::empty())
            .unwrap()
    };
    for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let response = app.clone().oneshot(get()).await.unwrap();
        assert_eq!(response.status(), expected);
        for field in ["ratelimit", "ratelimit-policy"] {
            let lines: Vec<&str> = (response.headers().get_all(field).iter())
                .map(|v| v.to_str().unwrap())
                .collect();
            assert_eq!(lines.len(), 1, "{field}: {lines:?}");
            assert_eq!(names(lines[0]), ["reply", "service"], "{field}: {lines:?}");
        }
    }
}
