//! The cases by hand: an estimate of 0 on a spent quota, and the overage the property found.

use crate::redis_support;

use std::sync::Arc;

use super::{
    handler, layer, leasing, memory, policies, prefix, request, sequential, Ask, Quiet, LIMIT,
    WINDOW,
};
use http::StatusCode;
use http_body_util::BodyExt;
use redis_support::current_thread_runtime;
use tokio::sync::Semaphore;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::BoxStore;
use tower_throttle::Policy;

/// The attack of the issue, by hand: an estimate of 0 on a quota of 10
/// units whose requests each cost 5. Only 2 requests get through, then
/// every one is refused until the window turns.
#[tokio::test]
async fn an_estimate_of_zero_is_refused_on_a_spent_quota() {
    for policy in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = Quiet::new(memory(&clock));
        let gate = Arc::new(Semaphore::new(100));
        let mut svc =
            layer(store.clone(), policy, "attack", false).layer(handler(gate, Arc::default()));
        let mut admitted = 0;
        for _ in 0..20 {
            let ask = Ask {
                estimate: 0,
                actual: 5,
                fails: false,
            };
            let response = svc.ready().await.unwrap().call(request(ask)).await.unwrap();
            admitted += usize::from(response.status() == StatusCode::OK);
            response.into_body().collect().await.unwrap();
            store.settled().await;
        }
        assert_eq!(admitted, 2, "{policy:?}: 2 × 5 units fill a quota of 10");
    }
}

/// The case the property found: GCRA leases over memory, a prefetched
/// block landing between the overage's two charges (the room shrank): the
/// overage looks again instead of dropping every unit.
#[test]
fn an_overage_looks_again_when_the_room_shrinks_meanwhile() {
    let rt = current_thread_runtime();
    let ask = |estimate, actual| Ask {
        estimate,
        actual,
        fails: false,
    };
    let asks = [ask(0, 2), ask(0, 8), ask(0, 0)];
    let policy = Policy::cell(LIMIT - 1, LIMIT, WINDOW).unwrap();
    rt.block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = Quiet::new(BoxStore::new(leasing(memory(&clock), &clock)));
        sequential(&store, policy, &prefix(), false, &asks).await
    })
    .unwrap();
}
