//! When several rules deny one request, the answer is the longest wait: a
//! client told the shorter one would come back only to be refused again.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::Global;
use tower_throttle::{Limiter, MemoryStore, Policy, Rule, ThrottleLayer};

fn every(secs: u64) -> Policy {
    Policy::cell(0, 1, Duration::from_secs(secs)).unwrap()
}

/// One request per 10 s and per 60 s: the second request is denied by both,
/// and `Retry-After` is the 60 s one, whichever rule comes first.
#[tokio::test]
async fn a_layer_answers_the_longest_wait_of_the_rules_that_deny() {
    for (first, second) in [(10, 60), (60, 10)] {
        let clock = ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let svc = ThrottleLayer::new(store, every(first))
            .key(Global)
            .and(Rule::new("other", every(second)))
            .layer(tower::service_fn(|_: Request<()>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }));
        let admitted = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(admitted.status(), StatusCode::OK);
        clock.advance(Duration::from_secs(1));
        let denied = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            denied.headers()[RETRY_AFTER],
            "59",
            "rules {first} s, {second} s"
        );
    }
}

/// The same through a `Limiter` of two rules: its binding decision is the longest
/// denial, and `retry_after` says so.
#[tokio::test]
async fn a_multi_limiter_reports_the_longest_wait() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::new(store, every(10))
        .named("short")
        .and("long", every(60));
    assert!(limiter.check("k").await.unwrap().allowed());
    clock.advance(Duration::from_secs(1));
    let d = limiter.check("k").await.unwrap();
    assert!(!d.allowed());
    assert_eq!(
        d.get("short").unwrap().retry_after,
        Some(Duration::from_secs(9))
    );
    assert_eq!(d.retry_after(), Some(Duration::from_secs(59)));
    assert_eq!(d.decision().retry_after, Some(Duration::from_secs(59)));
}
