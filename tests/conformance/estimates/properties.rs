//! Both properties, sequential and concurrent, on every in-process store and on Redis.

use crate::redis_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{
    asks, charged, config, handler, layer, leasing, memory, policies, prefix, request, sequential,
    Ask, Quiet, LIMIT,
};
use http::StatusCode;
use http_body_util::BodyExt;
use proptest::prelude::*;
use redis_support::{current_thread_runtime, RedisServer};
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{BoxStore, FallbackStore};
use tower_throttle::{Policy, Store};

/// Requests all admitted before any answers: the estimates they were
/// charged add up to at most the limit.
async fn concurrent<S: Store + Clone>(
    store: &Quiet<S>,
    policy: Policy,
    prefix: &str,
    count_if: bool,
    asks: &[Ask],
) -> Result<(), TestCaseError> {
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let svc = layer(store.clone(), policy, prefix, count_if)
        .layer(handler(gate.clone(), entered.clone()));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for ask in asks {
        let mut svc = svc.clone();
        let refused = refused.clone();
        let ask = *ask;
        calls.push(tokio::spawn(async move {
            let response = svc.ready().await.unwrap().call(request(ask)).await.unwrap();
            let status = response.status();
            if status == StatusCode::TOO_MANY_REQUESTS {
                refused.fetch_add(1, Ordering::SeqCst);
            }
            response.into_body().collect().await.unwrap();
            (ask, status)
        }));
    }
    let all_in = async {
        while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < asks.len() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_in)
        .await
        .expect("requests never arrived");
    let admitted = entered.load(Ordering::SeqCst);
    gate.add_permits(admitted);
    let mut charged_sum = 0u64;
    for call in calls {
        let (ask, status) = call.await.unwrap();
        if status != StatusCode::TOO_MANY_REQUESTS {
            charged_sum = charged_sum.saturating_add(charged(&ask));
        }
    }
    store.settled().await;
    prop_assert!(
        charged_sum <= LIMIT,
        "{} estimate units admitted at once ({:?})",
        charged_sum,
        policy
    );
    Ok(())
}

/// Runs both properties on the in-process stores: each case on a fresh
/// store of each kind.
#[test]
fn in_process_stores_refuse_a_spent_quota_whatever_the_estimate() {
    let rt = current_thread_runtime();
    for policy in policies() {
        proptest!(config(48), |(asks in asks(), count_if in any::<bool>())| {
            rt.block_on(async {
                let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
                let stores: Vec<(&str, BoxStore)> = vec![
                    ("memory", BoxStore::new(memory(&clock))),
                    ("fallback", BoxStore::new(FallbackStore::new(memory(&clock), memory(&clock)))),
                    ("lease", BoxStore::new(leasing(memory(&clock), &clock))),
                ];
                for (name, store) in stores {
                    let store = Quiet::new(store);
                    let named = |e: TestCaseError| TestCaseError::fail(format!("{name}: {e}"));
                    sequential(&store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                    concurrent(&store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                }
                Ok::<(), TestCaseError>(())
            })?;
        });
    }
}

/// The same on a real Redis server (client clock, frozen), directly and
/// through leases.
#[test]
fn redis_refuses_a_spent_quota_whatever_the_estimate() {
    let server = RedisServer::start();
    let rt = current_thread_runtime();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let redis = rt.block_on(async {
        RedisStore::builder()
            .prefix("estimates")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap()
    });
    let direct = Quiet::new(BoxStore::new(redis.clone()));
    let leased = Quiet::new(BoxStore::new(leasing(redis, &clock)));
    for policy in policies() {
        proptest!(config(16), |(asks in asks(), count_if in any::<bool>())| {
            rt.block_on(async {
                for (name, store) in [("redis", &direct), ("lease", &leased)] {
                    let named = |e: TestCaseError| TestCaseError::fail(format!("{name}: {e}"));
                    sequential(store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                    concurrent(store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                }
                Ok::<(), TestCaseError>(())
            })?;
        });
    }
}
