//! The deny cache: answers like Redis, invalidated by refund/reset/release, never admits more, bounded.

use crate::redis_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{client_store, evalsha_calls, memory};
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

// ---------------------------------------------------------- deny cache ---

/// Denials of a hot key are answered locally (fewer script calls than
/// checks) yet exactly as Redis and the memory store would answer them, and
/// the key is admitted again as soon as Redis would admit it.
#[test]
fn deny_cache_answers_like_redis_and_lets_go_in_time() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let policies = [
            Policy::cell(2, 1, Duration::from_secs(1)).unwrap(),
            Policy::fixed_window(3, Duration::from_secs(3)).unwrap(),
            Policy::sliding_window(3, Duration::from_secs(3)).unwrap(),
        ];
        for (i, p) in policies.iter().enumerate() {
            let key = format!("abuse{i}").into_bytes();
            let calls0 = evalsha_calls(&server);
            let mut checks = 0;
            for step in 0..400u64 {
                for cost in [1, 2, 1] {
                    let m = mem.check(Charge::new(&key, p, cost)).await.unwrap();
                    let r = store.check(Charge::new(&key, p, cost)).await.unwrap();
                    assert_eq!(m, r, "policy {i} step {step} cost {cost}");
                    checks += 1;
                }
                clock.advance(Duration::from_millis(10));
            }
            let calls = evalsha_calls(&server) - calls0;
            assert!(
                calls * 3 < checks,
                "policy {i}: {calls} calls for {checks} checks"
            );
        }
    });
}

/// Refund, reset and release drop the key's cached denial: the next check
/// is admitted at once.
#[test]
fn deny_cache_is_invalidated_by_refund_reset_and_release() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = client_store(&server.url(), &clock).await;
        let p = Policy::cell(1, 1, Duration::from_secs(3600)).unwrap();
        let k = b"inv";
        let fill = || async {
            while store.check(Charge::new(k, &p, 1)).await.unwrap().allowed {}
            assert!(!store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        };
        fill().await;
        assert_eq!(store.deny_cache_len(), 1);
        // A receipt of a unit taken now: its whole debt comes back.
        store
            .refund(k, &p, &Receipt::new(1, clock.now_ns(), None))
            .await
            .unwrap();
        assert_eq!(store.deny_cache_len(), 0);
        assert!(store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        fill().await;
        assert_eq!(store.deny_cache_len(), 1);
        store.reset(k, &p).await.unwrap();
        assert_eq!(store.deny_cache_len(), 0);
        assert!(store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        fill().await;
        store.release(k, &p, PermitId(1)).await.unwrap();
        // release does nothing for GCRA, and changes nothing in Redis either.
        assert!(!store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);

        // Sliding log and concurrency denials are never cached.
        for p in [
            Policy::sliding_log(1, Duration::from_secs(60)).unwrap(),
            Policy::concurrency(1).unwrap(),
        ] {
            let d = store.check(Charge::new(b"nc", &p, 1)).await.unwrap();
            assert!(d.allowed);
            let before = store.deny_cache_len();
            assert!(
                !store
                    .check(Charge::new(b"nc", &p, 1))
                    .await
                    .unwrap()
                    .allowed
            );
            assert_eq!(store.deny_cache_len(), before);
            if let Some(id) = d.permit {
                store.release(b"nc", &p, id).await.unwrap();
                assert!(
                    store
                        .check(Charge::new(b"nc", &p, 1))
                        .await
                        .unwrap()
                        .allowed
                );
            }
        }
    });
}

/// On server time, many callers hammering a denied key never get more than
/// Redis admits, and the cache stays within its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_never_admits_more_than_redis_and_is_bounded() {
    let server = RedisServer::start();
    let store = Arc::new(
        RedisStore::builder()
            .deny_cache(4)
            .connect(server.url())
            .await
            .unwrap(),
    );
    // 5 at once, then one every 100 ms.
    let p = Policy::cell(4, 10, Duration::from_secs(1)).unwrap();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..100_000 {
                    if t0.elapsed() > Duration::from_millis(800) {
                        break;
                    }
                    admitted += u64::from(
                        store
                            .check(Charge::new(b"hot", &p, 1))
                            .await
                            .unwrap()
                            .allowed,
                    );
                    tokio::task::yield_now().await;
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed = t0.elapsed();
    let bound = 5 + (elapsed.as_millis() as u64) / 100 + 1;
    assert!(
        admitted >= 5 && admitted <= bound,
        "{admitted} admitted in {elapsed:?}"
    );
    // Bounded: denials on many keys keep at most 4 entries.
    for i in 0..20 {
        let key = format!("k{i}").into_bytes();
        for _ in 0..6 {
            store.check(Charge::new(&key, &p, 1)).await.unwrap();
        }
        assert!(store.deny_cache_len() <= 4);
    }
}
