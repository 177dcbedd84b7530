//! Hostile keys and header values: distinct, fresh, escaped and bounded.

use std::collections::HashSet;
use std::time::Duration;

use super::{from_peer, hostile_header_values, hostile_keys, ok_service, Recorder};
use http::StatusCode;
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::key::{HeaderKey, MAX_KEY_PART};
use tower_throttle::{Limiter, MemoryStore, Policy, ThrottleLayer};

#[test]
fn hostile_keys_are_distinct_and_fresh_on_the_memory_store() {
    let limiter = Limiter::new(
        MemoryStore::new(),
        Policy::sliding_log(2, Duration::from_secs(60)).unwrap(),
    )
    .with_prefix("h");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        for k in hostile_keys() {
            let d = limiter.check(&k).await.unwrap();
            assert!(d.allowed && d.remaining == 1, "{:?}", &k[..k.len().min(16)]);
        }
        for k in hostile_keys() {
            assert_eq!(limiter.check(&k).await.unwrap().remaining, 0);
        }
    });
}
#[tokio::test]
async fn header_keys_are_escaped_bounded_and_distinct() {
    let store = Recorder::default();
    let svc = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(
                store.clone(),
                Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
            )
            .key(HeaderKey::new(http::HeaderName::from_static("x-api-key")))
            .prefix("h"),
        )
        .service(ok_service());
    let values = hostile_header_values();
    for round in 0..2 {
        for v in &values {
            let req = from_peer("192.0.2.1:1", &[("x-api-key", v.clone())]);
            let status = svc.clone().oneshot(req).await.unwrap().status();
            let want = if round == 0 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(
                status,
                want,
                "round {round} {:?}",
                &v.as_bytes()[..v.len().min(16)]
            );
        }
    }
    let keys = store.keys.lock().unwrap().clone();
    let distinct: HashSet<&Vec<u8>> = keys.iter().collect();
    assert_eq!(distinct.len(), values.len(), "one key per distinct value");
    for k in &keys {
        // "h:default:" + at most MAX_KEY_PART bytes, no control bytes.
        assert!(k.len() <= 10 + MAX_KEY_PART + 1, "{} bytes", k.len());
        assert!(k.iter().all(|&b| b >= 0x20 && b != 0x7f), "{k:?}");
    }
    // A missing or empty header is a typed outcome, not a shared bucket.
    let status = svc
        .clone()
        .oneshot(from_peer("192.0.2.1:1", &[]))
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
