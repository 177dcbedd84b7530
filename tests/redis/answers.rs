//! `Store::decide`'s promise, on a real `redis-server`: an answer that comes
//! later is a future that has not started, so one dropped before its first
//! poll charges nothing (the layer drops such an answer and asks again
//! through its own future); awaited, it charges once. Every store that can
//! answer later is tried: Redis alone, behind `Arc`, `BoxStore`,
//! `FallbackStore`, `LeasingStore` and `Hottest`, and every algorithm.

use std::sync::Arc;
use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{Answer, BoxStore, Charge, FallbackStore, Hottest};
use tower_throttle::{MemoryStore, Policy, Store};

use crate::peek::remaining;
use crate::redis_support::{current_thread_runtime, RedisServer};

const MIN: Duration = Duration::from_secs(60);

async fn redis(server: &RedisServer, clock: &ManualClock, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .time_source(TimeSource::client(clock.clone()))
        .connect(server.url())
        .await
        .unwrap()
}

fn policies() -> Vec<Policy> {
    vec![
        Policy::cell(4, 5, MIN).unwrap(),
        Policy::fixed_window(5, MIN).unwrap(),
        Policy::sliding_window(5, MIN).unwrap(),
        Policy::sliding_log(5, MIN).unwrap(),
        Policy::concurrency(5).unwrap(),
    ]
}

/// Drops `store`'s answer to a charge of one unit of `policy` on `key`
/// unpolled when it comes later (an answer given at once has charged),
/// then awaits a second; returns whether the first came later.
async fn drop_then_await<S: Store>(store: &S, key: &[u8], policy: &Policy) -> bool {
    let charge = [Charge::new(key, policy, 1)];
    let later = match store.decide(&charge) {
        Answer::Now(answer) => {
            assert!(answer.unwrap()[0].allowed);
            false
        }
        Answer::Later(_) => true,
    };
    let awaited = store.decide(&charge).await.unwrap();
    assert!(awaited[0].allowed);
    later
}

#[test]
fn a_later_answer_dropped_unpolled_charges_nothing_on_every_store_that_answers_later() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let plain = redis(&server, &clock, "answers").await;
        let memory = || MemoryStore::builder().clock(clock.clone()).build();
        let arc = Arc::new(plain.clone());
        let boxed = BoxStore::new(plain.clone());
        let fallback = FallbackStore::new(plain.clone(), memory()).clock(clock.clone());
        let leasing = LeasingStore::builder(plain.clone())
            .clock(clock.clone())
            .build()
            .unwrap();
        let hottest = Hottest::new(plain.clone(), 8, MIN).clock(clock.clone());
        for (i, policy) in policies().iter().enumerate() {
            let key = |store: &str| format!("{store}:{i}").into_bytes();
            let mut later = Vec::new();
            later.push(drop_then_await(&plain, &key("plain"), policy).await);
            later.push(drop_then_await(&arc, &key("arc"), policy).await);
            later.push(drop_then_await(&boxed, &key("boxed"), policy).await);
            later.push(drop_then_await(&fallback, &key("fallback"), policy).await);
            later.push(drop_then_await(&leasing, &key("leasing"), policy).await);
            later.push(drop_then_await(&hottest, &key("hottest"), policy).await);
            assert!(
                later.iter().all(|l| *l),
                "{policy:?}: every store asks Redis later"
            );
            // One unit taken on each key: the dropped answer took none.
            for store in ["plain", "arc", "boxed", "fallback", "leasing", "hottest"] {
                let left = remaining(&plain, &key(store), policy).await;
                assert_eq!(left, 4, "{store}, {policy:?}");
            }
        }
    });
}
