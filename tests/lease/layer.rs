//! A `ThrottleLayer` over a leasing store: a hot `Global` rule answered in
//! process, the `RateLimit` field's remaining the shared count as best
//! known, and `count_if`'s refunds put back into the lease.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::Global;
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Charge, MemoryStore, Store};
use tower_throttle::{Policy, ThrottleLayer};

use crate::counting_store::CountingStore;

type Shared = Arc<CountingStore<MemoryStore<ManualClock>>>;

fn stores() -> (Shared, LeasingStore<Shared>) {
    let clock = ManualClock::new();
    let shared: Shared = Arc::new(CountingStore::new(
        MemoryStore::builder().clock(clock.clone()).build(),
    ));
    let leasing = LeasingStore::builder(shared.clone())
        .clock(clock)
        .hot_threshold(2)
        .initial_block(16)
        .max_block(16)
        .blocks_per_period(1)
        .expiry_margin(Duration::ZERO)
        .build()
        .unwrap();
    (shared, leasing)
}

fn minute(n: u64) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

async fn status(req: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::new()));
    if req.uri().path() == "/fail" {
        *response.status_mut() = StatusCode::UNAUTHORIZED;
    }
    Ok(response)
}

fn get(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

/// The `r` of a response's `RateLimit` field.
fn remaining<B>(response: &Response<B>) -> u64 {
    let field = response.headers()["ratelimit"].to_str().unwrap();
    let r = field.split(';').find_map(|p| p.trim().strip_prefix("r="));
    r.unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_hot_global_rule_is_answered_in_process_within_its_limit() {
    let (shared, leasing) = stores();
    let svc = ThrottleLayer::new(leasing.clone(), minute(40))
        .key(Global)
        .headers_on_allowed(true)
        .layer(tower::service_fn(status));
    let mut statuses = Vec::new();
    for n in 1..=45u64 {
        let response = svc.clone().oneshot(get("/")).await.unwrap();
        if response.status() == StatusCode::OK {
            // One process: the estimate is the exact shared count.
            assert_eq!(remaining(&response), 40 - n);
        }
        statuses.push(response.status());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 40);
    assert!(statuses[40..]
        .iter()
        .all(|s| *s == StatusCode::TOO_MANY_REQUESTS));
    // 1 cold check, blocks of 16, 16 and 7, then the 5 denials.
    assert_eq!(shared.checks(), 1 + 3 + 5);
}

#[tokio::test]
async fn count_if_refunds_go_back_into_the_lease() {
    let (shared, leasing) = stores();
    let policy = minute(100);
    let svc = ThrottleLayer::new(leasing.clone(), policy)
        .key(Global)
        .count_if(|s| s == StatusCode::UNAUTHORIZED)
        .layer(tower::service_fn(status));
    for _ in 0..30 {
        let ok = svc.clone().oneshot(get("/")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        // The refund runs on a task of its own.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }
    let failed = svc.clone().oneshot(get("/fail")).await.unwrap();
    assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(shared.checks(), 2, "one cold check, one block");
    // The shared store counts the cold check's refund (back in its
    // window), the block, and nothing else; the block's units go back
    // on shutdown except the failure's.
    leasing.shutdown().await.unwrap();
    let key = shared_key(&shared).await;
    let peek = shared.inner.check(Charge::new(&key, &policy, 0)).await;
    assert_eq!(peek.unwrap().remaining, 99);
}

/// The one key the layer wrote to the shared store.
async fn shared_key(shared: &Shared) -> Vec<u8> {
    let calls = shared.calls.lock().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    calls.keys().next().unwrap().clone()
}
