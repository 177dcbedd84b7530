//! redis-cell's replies: the `CL.THROTTLE` examples, a missing module, `remaining` to the bit.

use crate::redis_support;

use std::time::{Duration, Instant};

use super::{client_store, memory};
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::CellStore;
use tower_throttle::store::Charge;
use tower_throttle::{Decision, Policy, Store, StoreError};

// ----------------------------------------------------------- redis-cell ---

#[test]
fn cl_throttle_examples_from_the_design() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let manual = client_store(&server.url(), &clock).await;
        let on_server = RedisStore::builder()
            .prefix("srv")
            .connect(server.url())
            .await
            .unwrap();
        let p = Policy::cell(15, 30, Duration::from_secs(60)).unwrap();
        for store in [&manual, &on_server] {
            // On the server's clock the last reply's times (rounded up to
            // whole seconds) are the design's while the 17 checks take under
            // a second: a run the machine stalled longer goes again on a
            // fresh key. The manual clock never moves.
            for attempt in 0..10 {
                let key = format!("laoqian{attempt}");
                let rule = Charge::new(key.as_bytes(), &p, 1);
                let started = Instant::now();
                let first = store.check(rule).await.unwrap().to_cell_reply();
                let mut burst = Vec::new();
                for _ in 0..15 {
                    burst.push(store.check(rule).await.unwrap().allowed);
                }
                let last = store.check(rule).await.unwrap().to_cell_reply();
                if started.elapsed() >= Duration::from_millis(900) && attempt < 9 {
                    continue;
                }
                assert_eq!(first, [0, 16, 15, -1, 2]);
                assert!(burst.iter().all(|&allowed| allowed));
                assert_eq!(last, [1, 16, 0, 2, 32]);
                break;
            }
        }
    });
}

#[test]
fn cell_store_reports_a_missing_module_clearly() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let err = CellStore::connect(RedisStore::builder(), server.url())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("redis-cell"), "{err}");
        let err = CellStore::builder()
            .prefix("cells")
            .timeout(Duration::from_secs(2))
            .require_safe_eviction(true)
            .connect(server.url())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("redis-cell"), "{err}");
    });
}

/// redis-cell 0.5.0 computes `remaining` in whole microseconds: for
/// `cell(100, 853, 3 s)` (T = 3,516,998 ns), a cost of 2 at t = 0 then a peek
/// at t = T − 50 µs answers `[0, 101, 100, -1, 1]` from `CL.THROTTLE`, where
/// exact nanoseconds would give 99. Every store answers as redis-cell does.
#[test]
fn cell_remaining_is_redis_cells_to_the_bit() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let p = Policy::cell(100, 853, Duration::from_secs(3)).unwrap();
        let funnel = Policy::token_bucket(101, 853.0 / 3.0).unwrap();
        let stores: [&dyn DynCheck; 2] = [&mem, &redis];
        for (i, store) in stores.into_iter().enumerate() {
            let key = format!("c{i}");
            let rule = Charge::new(key.as_bytes(), &p, 2);
            assert_eq!(store.run(rule).await.to_cell_reply(), [0, 101, 99, -1, 1]);
            clock.advance(Duration::from_nanos(3_516_998 - 50_000));
            let peek = Charge::new(key.as_bytes(), &p, 0);
            assert_eq!(store.run(peek).await.to_cell_reply(), [0, 101, 100, -1, 1]);
            // The other GCRA constructors keep exact nanoseconds (T = 3,516,999).
            clock.advance(Duration::from_secs(60));
            let key = format!("f{i}");
            assert_eq!(
                store
                    .run(Charge::new(key.as_bytes(), &funnel, 2))
                    .await
                    .remaining,
                99
            );
            clock.advance(Duration::from_nanos(3_516_999 - 50_000));
            let peek = Charge::new(key.as_bytes(), &funnel, 0);
            assert_eq!(store.run(peek).await.remaining, 99);
            clock.advance(Duration::from_secs(60));
        }
    });
}

/// Object-safe `check` for iterating over stores of different types.
trait DynCheck {
    fn run<'a>(
        &'a self,
        rule: Charge<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>>;
}

impl<S: Store> DynCheck for S {
    fn run<'a>(
        &'a self,
        rule: Charge<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>> {
        Box::pin(async move { self.check(rule).await.unwrap() })
    }
}
