//! `ThrottleLayer::peek` and `reset`: a key's state under every rule, read
//! as requests left it and without charging, and forgotten on demand.

use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

fn layer() -> ThrottleLayer<MemoryStore<ManualClock>> {
    let store = MemoryStore::builder().clock(ManualClock::new()).build();
    ThrottleLayer::new(
        store,
        Policy::fixed_window(3, Duration::from_secs(60)).unwrap(),
    )
    .name("minute")
    .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
    .and(Rule::new(
        "hour",
        Policy::sliding_log(10, Duration::from_secs(3600)).unwrap(),
    ))
    .prefix("api")
}

async fn send(layer: &ThrottleLayer<MemoryStore<ManualClock>>, user: &str) -> StatusCode {
    let svc = layer
        .clone()
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        }));
    let req = Request::builder().header("x-user", user).body(()).unwrap();
    svc.oneshot(req).await.unwrap().status()
}

#[tokio::test]
async fn peek_reads_every_rule_as_requests_left_it_and_charges_nothing() {
    let layer = layer();
    // A key part longer than the store keeps is digested as requests do.
    let long = "u".repeat(600);
    for user in ["alice", long.as_str()] {
        for _ in 0..2 {
            assert_eq!(send(&layer, user).await, StatusCode::OK);
        }
        for _ in 0..3 {
            let state = layer.peek(user).await.unwrap();
            assert_eq!(state.get("minute").unwrap().remaining, 1, "{}", &user[..5]);
            assert_eq!(state.get("hour").unwrap().remaining, 8);
            assert!(state.allowed());
        }
    }
    assert_eq!(
        layer
            .peek("bob")
            .await
            .unwrap()
            .get("minute")
            .unwrap()
            .remaining,
        3
    );
}

#[tokio::test]
async fn reset_forgets_the_key_under_every_rule() {
    let layer = layer();
    for _ in 0..3 {
        assert_eq!(send(&layer, "alice").await, StatusCode::OK);
    }
    assert_eq!(send(&layer, "alice").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        layer
            .peek("alice")
            .await
            .unwrap()
            .get("minute")
            .unwrap()
            .remaining,
        0
    );
    layer.reset("alice").await.unwrap();
    let state = layer.peek("alice").await.unwrap();
    assert_eq!(state.get("minute").unwrap().remaining, 3);
    assert_eq!(state.get("hour").unwrap().remaining, 10);
    assert_eq!(send(&layer, "alice").await, StatusCode::OK);
}
