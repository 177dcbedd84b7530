//! All-or-nothing multi-rule checks, server time against skewed app clocks, several instances on one key.

use crate::redis_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{client_store, five, memory, no_permit};
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Decision, Policy, Store, StoreError};

// --------------------------------------------------------- all or nothing ---

#[test]
fn multi_rule_checks_are_all_or_nothing_and_match_memory() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let policies = five(3);
        let tight = Policy::fixed_window(1, Duration::from_secs(10)).unwrap();
        let names: Vec<Vec<u8>> = (0..5).map(|i| format!("rule{i}").into_bytes()).collect();
        let mut rules: Vec<Charge<'_>> = names
            .iter()
            .zip(&policies)
            .map(|(k, p)| Charge::new(k, p, 1))
            .collect();
        rules.push(Charge::new(b"tight", &tight, 1));
        for round in 0..4 {
            let m = mem.check_all(&rules).await.unwrap();
            let r = redis.check_all(&rules).await.unwrap();
            let strip = |v: Vec<Decision>| v.into_iter().map(no_permit).collect::<Vec<_>>();
            assert_eq!(strip(m.clone()), strip(r.clone()), "round {round}");
            // Only the first round fits the tight rule; later rounds charge nothing.
            assert_eq!(r.iter().all(|d| d.allowed), round == 0);
            for d in &r[..5] {
                assert!(d.allowed);
                assert_eq!(
                    d.remaining, 2,
                    "round {round}: the failed rounds consumed nothing"
                );
            }
            clock.advance(Duration::from_millis(1));
        }
        for (k, p) in names.iter().zip(&policies) {
            let peek = redis.check(Charge::new(k, p, 0)).await.unwrap();
            assert_eq!(peek.remaining, 2);
        }
        let dup = [
            Charge::new(b"same", &tight, 1),
            Charge::new(b"same", &policies[0], 1),
        ];
        assert!(matches!(
            redis.check_all(&dup).await,
            Err(StoreError::InvalidRequest(_))
        ));
    });
}

// ------------------------------------------------------------ server time ---

/// Sends `n` checks alternately through two store instances; counts the admitted.
async fn alternate<A: Store, B: Store>(a: &A, b: &B, rule: Charge<'_>, n: usize) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        let d = if i % 2 == 0 {
            a.check(rule).await
        } else {
            b.check(rule).await
        };
        admitted += u64::from(d.unwrap().allowed);
    }
    admitted
}

#[test]
fn skewed_app_clocks_are_irrelevant_with_server_time() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let p = Policy::cell(9, 1, Duration::from_secs(3600)).unwrap();
        let rule = Charge::new(b"user", &p, 1);
        // Two app instances whose own clocks are hours apart, on server time.
        let a = RedisStore::connect(server.url()).await.unwrap();
        let b = RedisStore::connect(server.url()).await.unwrap();
        let admitted = alternate(&a, &b, rule, 30).await;
        assert_eq!(admitted, 10);
        let asked = Instant::now();
        let (da, db) = (a.check(rule).await.unwrap(), b.check(rule).await.unwrap());
        // On one clock the resets differ by the time between the two checks:
        // under a second, or at most what a stalled machine took.
        let between = asked.elapsed().max(Duration::from_secs(1));
        let diff = da.reset_after.abs_diff(db.reset_after);
        assert!(diff < between, "{da:?} vs {db:?}");

        // The same two instances trusting their own skewed clocks disagree:
        // the one two hours ahead sees the other's state as long gone.
        let early = ManualClock::starting_at(1_700_000_000_000_000_000);
        let late = ManualClock::starting_at(1_700_000_000_000_000_000 + 7_200_000_000_000);
        let a = client_store(&server.url(), &early).await;
        let b = client_store(&server.url(), &late).await;
        let rule = Charge::new(b"skewed", &p, 1);
        let admitted = alternate(&a, &b, rule, 30).await;
        assert!(
            admitted > 10,
            "client clocks skewed by 2 h over-admit: {admitted}"
        );
    });
}

// ------------------------------------------------------ several instances ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_hammering_one_key_admit_exactly_the_bound() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(client_store(&server.url(), &frozen).await));
    }
    let bound = 50;
    for (i, policy) in five(bound).into_iter().enumerate() {
        let key = format!("hot{i}").into_bytes();
        let mut tasks = Vec::new();
        for store in &stores {
            for _ in 0..8 {
                let (store, key) = (store.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..20 {
                        let d = store.check(Charge::new(&key, &policy, 1)).await.unwrap();
                        admitted += u64::from(d.allowed);
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(
            total, bound,
            "policy {i}: 4 instances × 8 tasks × 20 checks"
        );
    }
    // On server time too (GCRA refills one unit an hour: nothing comes back).
    let p = Policy::cell(bound - 1, 1, Duration::from_secs(3600)).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = Arc::new(RedisStore::connect(server.url()).await.unwrap());
        for _ in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..20 {
                    admitted += u64::from(
                        store
                            .check(Charge::new(b"srv", &p, 1))
                            .await
                            .unwrap()
                            .allowed,
                    );
                }
                admitted
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, bound);
}
