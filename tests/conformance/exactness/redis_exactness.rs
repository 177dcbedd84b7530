//! The same phases and multi-rule checks on Redis and a Redis Cluster from 4 store instances.

use super::*;
use crate::redis_support::{RedisCluster, RedisServer};
use tokio::sync::Barrier as AsyncBarrier;
use tower_throttle::store::redis::{HashTag, RedisStore, TimeSource};
use tower_throttle::Store;

const INSTANCES: usize = 4;
const TASKS: usize = 8;
const REDIS_PHASES: usize = 16;
const REDIS_PER_PHASE: usize = 4;

fn builder(clock: &ManualClock, prefix: &str) -> tower_throttle::store::redis::RedisStoreBuilder {
    RedisStore::builder()
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .hash_tag(HashTag::PerKey)
}

/// 4 instances × 8 tasks, phases as in the memory test; per phase the
/// count admitted equals the model's.
async fn phases_on<S: Store + Clone>(what: &str, stores: Vec<S>, clock: &ManualClock) {
    let steps = schedule(REDIS_PHASES);
    for (name, policy) in policies() {
        let key = format!("{what}:{name}").into_bytes();
        let want = model_per_phase(
            &policy,
            clock.now_ns() / 1000 * 1000,
            &steps,
            INSTANCES * TASKS * REDIS_PER_PHASE,
        );
        let got: Arc<Vec<AtomicU64>> =
            Arc::new((0..REDIS_PHASES).map(|_| AtomicU64::new(0)).collect());
        let barrier = Arc::new(AsyncBarrier::new(INSTANCES * TASKS));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().enumerate() {
            for t in 0..TASKS {
                let (store, clock, got, barrier, steps, key) = (
                    store.clone(),
                    clock.clone(),
                    got.clone(),
                    barrier.clone(),
                    steps.clone(),
                    key.clone(),
                );
                tasks.push(tokio::spawn(async move {
                    for (phase, step) in steps.iter().enumerate() {
                        barrier.wait().await;
                        for _ in 0..REDIS_PER_PHASE {
                            let d = store.check(Charge::new(&key, &policy, 1)).await.unwrap();
                            got[phase].fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                        }
                        barrier.wait().await;
                        if i == 0 && t == 0 {
                            clock.advance(*step);
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("a checking task panicked");
        }
        let got: Vec<u64> = got.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        println!(
            "{what} {name}: {} checks, admitted {}, model {}",
            INSTANCES * TASKS * REDIS_PER_PHASE * REDIS_PHASES,
            got.iter().sum::<u64>(),
            want.iter().sum::<u64>()
        );
        assert_eq!(got, want, "{what} {name}: per phase");
        // Next algorithm from a clean instant.
        clock.advance(Duration::from_secs(10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_admit_exactly_the_model_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(builder(&clock, "x").connect(server.url()).await.unwrap());
    }
    phases_on("redis", stores, &clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_admit_exactly_the_model_on_a_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(
            builder(&clock, "x")
                .connect_cluster(cluster.urls())
                .await
                .unwrap(),
        );
    }
    phases_on("cluster", stores, &clock).await;
    // Multi-rule checks on a cluster need one hash tag for their keys.
    let mut tagged = Vec::new();
    for _ in 0..INSTANCES {
        tagged.push(
            builder(&clock, "m")
                .hash_tag(HashTag::AfterFirst(b':'))
                .connect_cluster(cluster.urls())
                .await
                .unwrap(),
        );
    }
    multi_rule_on("cluster", tagged).await;
}

/// All-or-nothing from 4 instances × 8 tasks: the loose rules are charged
/// exactly the admitted requests' costs.
async fn multi_rule_on<S: Store + Clone>(what: &str, stores: Vec<S>) {
    let tight = Policy::sliding_log(7, Duration::from_secs(3600)).unwrap();
    let loose = Policy::fixed_window(100_000, Duration::from_secs(86_400)).unwrap();
    // A burst of 100,000 at 100,000 a day (a tolerance of a day: Redis
    // takes GCRA tolerances below 52 days).
    let gcra = Policy::cell(99_999, 100_000, Duration::from_secs(86_400)).unwrap();
    let mut tasks = Vec::new();
    for store in &stores {
        for t in 0..TASKS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let cost = 1 + t as u64 % 2;
                let mut units = 0;
                for _ in 0..10 {
                    // One hash tag after the first ':' so a cluster takes them in one script.
                    let rules = [
                        Charge::new(b"tight:alice", &tight, cost),
                        Charge::new(b"loose:alice", &loose, cost),
                        Charge::new(b"gcra:alice", &gcra, cost),
                    ];
                    let d = store.check_all(&rules).await.unwrap();
                    if d.iter().all(|d| d.allowed) {
                        units += cost;
                    }
                }
                units
            }));
        }
    }
    let mut units = 0;
    for t in tasks {
        units += t.await.unwrap();
    }
    let store = &stores[0];
    let peek = |k: &'static [u8], p: Policy| async move {
        store.check(Charge::new(k, &p, 0)).await.unwrap().remaining
    };
    println!("{what} multi-rule: {units} units admitted of 7");
    assert!(units == 7 || units == 6, "{units}");
    assert_eq!(7 - peek(b"tight:alice", tight).await, units);
    assert_eq!(100_000 - peek(b"loose:alice", loose).await, units);
    assert_eq!(100_000 - peek(b"gcra:alice", gcra).await, units);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_rule_checks_charge_only_admitted_requests_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(
            builder(&clock, "m")
                .hash_tag(HashTag::AfterFirst(b':'))
                .connect(server.url())
                .await
                .unwrap(),
        );
    }
    multi_rule_on("redis", stores).await;
}
