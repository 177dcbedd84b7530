//! The admin example's routers (`examples/admin/app.rs`, built here as the
//! example builds them): requests through the API, then what the admin
//! endpoints answer about them, as JSON.

#[path = "../../examples/admin/app.rs"]
mod app;

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::Router;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::BoxStore;
use tower_throttle::MemoryStore;

/// Alice's request to the API, from the address a server would record.
async fn hello(api: &Router, user: &str) -> StatusCode {
    let mut req = Request::get("/hello")
        .header("authorization", format!("Bearer {user}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let peer: SocketAddr = "203.0.113.7:40000".parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    api.clone().oneshot(req).await.unwrap().status()
}

async fn admin_call(admin: &Router, method: Method, uri: &str) -> Value {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(axum::body::Body::empty())
        .unwrap();
    let res = admin.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{uri}");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

/// The rule named `name` of a `/admin/limits` answer.
fn rule<'a>(answer: &'a Value, name: &str) -> &'a Value {
    let rules = answer["rules"].as_array().unwrap();
    rules.iter().find(|r| r["rule"] == name).unwrap()
}

#[tokio::test]
async fn the_admin_endpoints_answer_what_the_api_requests_did() {
    let store = MemoryStore::builder().clock(ManualClock::new()).build();
    let limits = app::limits(BoxStore::new(store)).unwrap();
    let (api, admin) = (app::api(limits.clone()), app::admin(limits));
    for i in 0..6 {
        let expected = [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS][usize::from(i == 5)];
        assert_eq!(hello(&api, "alice").await, expected, "request {i}");
    }
    assert_eq!(hello(&api, "bob").await, StatusCode::OK);

    // By user: the rules keyed by user, and the per-address rule reported
    // as having no key for a user alone.
    let alice = admin_call(&admin, Method::GET, "/admin/limits/alice").await;
    let minute = rule(&alice, "minute");
    assert_eq!(
        (&minute["limit"], &minute["remaining"]),
        (&5.into(), &0.into())
    );
    assert_eq!(minute["key"], "api:minute:alice");
    assert!(minute["reset_after_ms"].as_u64().unwrap() > 0);
    assert_eq!(rule(&alice, "day")["remaining"], 95);
    let per_ip = rule(&alice, "per-ip");
    assert!(per_ip["key"].is_null() && per_ip["missing"].as_str().unwrap().contains("peer"));

    // With the address: 6 requests from it, 6th refused by the minute
    // rule, so not charged to the address.
    let with_ip = admin_call(&admin, Method::GET, "/admin/limits/alice?ip=203.0.113.7").await;
    assert_eq!(rule(&with_ip, "per-ip")["remaining"], 300 - 6);

    let hottest = admin_call(&admin, Method::GET, "/admin/hottest").await;
    assert_eq!(
        (&hottest["checks"], &hottest["denials"]),
        (&(7 * 3).into(), &1.into())
    );
    let top = &hottest["by_checks"][0];
    assert_eq!(top["key"], "api:per-ip:203.0.113.7");
    assert_eq!(
        (&top["count"], &top["exact"], &top["shown"]),
        (&7.into(), &true.into(), &"7".into())
    );
    let denied = &hottest["by_denials"][0];
    assert_eq!(
        (&denied["key"], &denied["lower_bound"]),
        (&"api:minute:alice".into(), &1.into())
    );

    // A reset by user gives alice a fresh quota at once.
    let reset = admin_call(&admin, Method::DELETE, "/admin/limits/alice").await;
    assert_eq!(rule(&reset, "minute")["reset"], true);
    let alice = admin_call(&admin, Method::GET, "/admin/limits/alice").await;
    assert_eq!(rule(&alice, "minute")["remaining"], 5);
    assert_eq!(hello(&api, "alice").await, StatusCode::OK);
}
