//! The Redis store on a private 3-master cluster: the same scripts, one slot
//! per script, multi-rule checks, bounds across masters, hostile keys.

use crate::redis_support;

use std::sync::Arc;
use std::time::Duration;

use redis_support::{runtime, RedisCluster};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::redis::{HashTag, RedisClusterStore, RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Decision, MemoryStore, Policy, Store, StoreError};

async fn store(cluster: &RedisCluster, tag: HashTag) -> RedisClusterStore {
    RedisStore::builder()
        .prefix("c")
        .hash_tag(tag)
        .timeout(Duration::from_secs(5))
        .connect_cluster(cluster.urls())
        .await
        .unwrap()
}

fn five(n: u64) -> Vec<Policy> {
    let w = Duration::from_secs(60);
    vec![
        Policy::cell(n - 1, 1, Duration::from_secs(3600)).unwrap(),
        Policy::sliding_log(n, w).unwrap(),
        Policy::fixed_window(n, Duration::from_secs(86_400)).unwrap(),
        Policy::sliding_window(n, Duration::from_secs(86_400)).unwrap(),
        Policy::concurrency_with_lease(n, w).unwrap(),
    ]
}

fn slot(cluster: &RedisCluster, key: &[u8]) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut cluster.nodes[0].conn())
        .unwrap()
}

/// The bytes between the first `{` and the next `}`.
fn tag_of(key: &[u8]) -> &[u8] {
    let open = key.iter().position(|&b| b == b'{').unwrap();
    let close = open + key[open..].iter().position(|&b| b == b'}').unwrap();
    &key[open + 1..close]
}

#[test]
fn one_cluster_many_properties() {
    let cluster = RedisCluster::start();
    runtime().block_on(async {
        multi_rule_checks_share_a_slot(&cluster).await;
        bound_holds_across_masters(&cluster).await;
        hostile_keys_land_in_their_tags_slot(&cluster).await;
        same_decisions_as_memory(&cluster).await;
        an_idle_store_sends_nothing(&cluster).await;
    });
}

/// Script calls the cluster's nodes have run, in all.
fn script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut node.conn())
                .unwrap();
            info.lines()
                .filter(|l| l.starts_with("cmdstat_evalsha:"))
                .filter_map(|l| {
                    l.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>()
        })
        .sum()
}

async fn an_idle_store_sends_nothing(cluster: &RedisCluster) {
    let store = store(cluster, HashTag::PerKey).await;
    let p = Policy::cell(4, 1, Duration::from_secs(3600)).unwrap();
    // Its batcher is running once a check has gone through it.
    assert!(
        store
            .check(Charge::new(b"idle", &p, 1))
            .await
            .unwrap()
            .allowed
    );
    let before = tokio::task::block_in_place(|| script_calls(cluster));
    // Real time is the point here: what the store sends while nobody asks.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = tokio::task::block_in_place(|| script_calls(cluster));
    assert_eq!(after, before, "script calls from an idle store");
}

async fn multi_rule_checks_share_a_slot(cluster: &RedisCluster) {
    let by_user = store(cluster, HashTag::AfterFirst(b':')).await;
    let replies = Policy::sliding_log(2, Duration::from_secs(60)).unwrap();
    let posts = Policy::cell(4, 1, Duration::from_secs(3600)).unwrap();
    let rules = [
        Charge::new(b"reply:alice", &replies, 1),
        Charge::new(b"post:alice", &posts, 1),
    ];
    for round in 0..4 {
        let d = by_user.check_all(&rules).await.unwrap();
        assert_eq!(d.iter().all(|d| d.allowed), round < 2, "round {round}");
    }
    // The denied rounds charged nothing to the GCRA rule.
    let peek = by_user
        .check(Charge::new(b"post:alice", &posts, 0))
        .await
        .unwrap();
    assert_eq!(peek.remaining, 3);
    let a = by_user.redis_key(b"reply:alice", &replies);
    let b = by_user.redis_key(b"post:alice", &posts);
    assert_eq!(slot(cluster, &a), slot(cluster, &b));

    // Per-key tags differ: refused up front rather than CROSSSLOT.
    let per_key = store(cluster, HashTag::PerKey).await;
    let err = per_key.check_all(&rules).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");

    // One fixed tag: any rules combine.
    let fixed = store(cluster, HashTag::Fixed("all".into())).await;
    let rules = [
        Charge::new(b"global", &posts, 1),
        Charge::new(b"ip:10.0.0.1", &replies, 1),
    ];
    assert!(fixed.check_all(&rules).await.unwrap()[1].allowed);
}

async fn bound_holds_across_masters(cluster: &RedisCluster) {
    let bound = 10;
    // Four instances on one frozen clock: on the server's, a day boundary
    // mid-test would open a new fixed window and admit twice the bound.
    let clock = ManualClock::new();
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::builder()
            .prefix("c")
            .hash_tag(HashTag::PerKey)
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        stores.push(Arc::new(store));
    }
    for (i, policy) in five(bound).into_iter().enumerate() {
        let mut tasks = Vec::new();
        for user in 0..24 {
            for s in &stores {
                let s = s.clone();
                let key = format!("spread{i}:{user}").into_bytes();
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..6 {
                        let d = s.check(Charge::new(&key, &policy, 1)).await.unwrap();
                        admitted += u64::from(d.allowed);
                    }
                    (user, admitted)
                }));
            }
        }
        let mut per_user = [0u64; 24];
        for t in tasks {
            let (user, n) = t.await.unwrap();
            per_user[user] += n;
        }
        assert!(
            per_user.iter().all(|&n| n == bound),
            "policy {i}: {per_user:?}"
        );
    }
    let busy = cluster
        .nodes
        .iter()
        .filter(|n| redis::cmd("DBSIZE").query::<u64>(&mut n.conn()).unwrap() > 0)
        .count();
    assert_eq!(busy, 3, "120 keys spread over every master");
}

async fn hostile_keys_land_in_their_tags_slot(cluster: &RedisCluster) {
    let s = store(cluster, HashTag::PerKey).await;
    let mut keys: Vec<Vec<u8>> = [
        &b"{"[..],
        b"}",
        b"{}",
        b"a{b}c",
        b"{user}:x",
        b"nl\n",
        b"nul\0",
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    keys.push(vec![b'{'; 10_000]);
    keys.push(vec![b'}'; 10_000]);
    for p in five(3) {
        for k in &keys {
            let d = s.check(Charge::new(k, &p, 1)).await.unwrap();
            assert_eq!(d.remaining, 2);
            let rk = s.redis_key(k, &p);
            let tag = tag_of(&rk);
            assert_eq!(tag.len(), 8);
            assert!(tag.iter().all(u8::is_ascii_hexdigit));
            assert_eq!(slot(cluster, &rk), slot(cluster, tag));
        }
    }
}

/// A deterministic pseudo-random walk per algorithm, on a client clock,
/// compared with the memory store decision by decision.
async fn same_decisions_as_memory(cluster: &RedisCluster) {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let redis = RedisStore::builder()
        .prefix("m")
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .timeout(Duration::from_secs(5))
        .connect_cluster(cluster.urls())
        .await
        .unwrap();
    let mem = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % n
    };
    let strip = |d: Decision| Decision {
        permit: d.permit.map(|_| PermitId(0)),
        ..d
    };
    let w = Duration::from_micros(1_234_567);
    let third = Duration::from_nanos(333_333_333);
    let policies = [
        Policy::cell(3, 1, Duration::from_micros(300_007)).unwrap(),
        Policy::sliding_log(4, w).unwrap(),
        Policy::fixed_window(4, w).unwrap(),
        Policy::sliding_window(4, w).unwrap(),
        Policy::concurrency_with_lease(4, w).unwrap(),
        // Not whole µs (1/3 s): exact on the cluster too.
        Policy::sliding_log(4, third).unwrap(),
        Policy::fixed_window(4, third).unwrap(),
        Policy::sliding_window(4, third).unwrap(),
        Policy::concurrency_with_lease(4, third).unwrap(),
    ];
    for (i, p) in policies.iter().enumerate() {
        let keys: Vec<Vec<u8>> = (0..3)
            .map(|k| format!("walk{i}:{k}").into_bytes())
            .collect();
        let mut permits: Vec<(usize, PermitId, PermitId)> = Vec::new();
        let mut receipts: Vec<(usize, Receipt, Receipt)> = Vec::new();
        for step in 0..300 {
            let key = next(3) as usize;
            let k = &keys[key];
            match next(10) {
                0..=1 => clock.advance(Duration::from_micros(next(400_000))),
                2..=6 => {
                    let cost = next(6);
                    let m = mem.check(Charge::new(k, p, cost)).await.unwrap();
                    let r = redis.check(Charge::new(k, p, cost)).await.unwrap();
                    assert_eq!(strip(m), strip(r), "policy {i} step {step}");
                    if let (Some(a), Some(b)) = (m.permit, r.permit) {
                        permits.push((key, a, b));
                    }
                    if let (Some(a), Some(b)) = (m.receipt(), r.receipt()) {
                        receipts.push((key, a, b));
                    }
                }
                7 if !receipts.is_empty() => {
                    let n = next(3) + 1;
                    let (key, a, b) = receipts.swap_remove(next(receipts.len() as u64) as usize);
                    mem.refund(&keys[key], p, &a.part(n)).await.unwrap();
                    redis.refund(&keys[key], p, &b.part(n)).await.unwrap();
                }
                8 if !permits.is_empty() => {
                    let (key, a, b) = permits.remove(next(permits.len() as u64) as usize);
                    mem.release(&keys[key], p, a).await.unwrap();
                    redis.release(&keys[key], p, b).await.unwrap();
                }
                _ => {
                    let checks = [Charge::new(&keys[0], p, 1), Charge::new(&keys[1], p, 0)];
                    // Multi-rule needs one slot: only on one key here.
                    let m = mem.check_all(&checks[..1]).await.unwrap();
                    let r = redis.check_all(&checks[..1]).await.unwrap();
                    assert_eq!(strip(m[0]), strip(r[0]), "policy {i} step {step}");
                    if let (Some(a), Some(b)) = (m[0].permit, r[0].permit) {
                        permits.push((0, a, b));
                    }
                }
            }
        }
    }
}
