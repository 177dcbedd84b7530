//! A cluster master killed mid-load and restarted.

use crate::redis_support;

use crate::faults;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::load::Load;
use super::{
    assert_bounded, assert_no_task_leak, baseline_tasks, count, counts, manual_time, policy,
    Phases, Rec, Via, FAULT, TIMEOUT,
};
use redis_support::{runtime, RedisCluster, RedisServer};
use tower_throttle::store::redis::RedisStore;

/// Waits (≤ 10 s) until `node` reports `cluster_state:ok`.
fn cluster_ok(node: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.conn())
            .unwrap_or_default();
        if info.contains("cluster_state:ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cluster not ok again within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cluster_user(u: usize) -> String {
    format!("cu{u}")
}

const CLUSTER_USERS: usize = 12;

/// The key a request of `via` for `user` is charged to.
fn cluster_key(via: Via, user: usize) -> String {
    match via {
        Via::Open => format!("open:r:{}", cluster_user(user)),
        Via::Closed => format!("closed:r:{}", cluster_user(user)),
        Via::Store => format!("store:{}", cluster_user(user)),
    }
}

#[test]
fn cluster_master_killed_then_restarted() {
    let mut cluster = RedisCluster::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::builder()
            .prefix("f")
            .timeout(TIMEOUT)
            .time_source(manual_time())
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        // Which (path, user) keys live on the master we kill.
        let victim = cluster.nodes[2].port;
        let p = policy();
        let on_victim = |via: Via, user: usize| {
            let key = store.redis_key(cluster_key(via, user).as_bytes(), &p);
            let slot = faults::keyslot(&cluster.nodes[0], &key);
            faults::master_port_of_slot(&cluster.nodes[0], slot) == victim
        };
        let mut victims = BTreeMap::new();
        for via in [Via::Open, Via::Closed, Via::Store] {
            for user in 0..3 * CLUSTER_USERS {
                victims.insert((via, user), on_victim(via, user));
            }
        }
        for via in [Via::Open, Via::Closed, Via::Store] {
            let fault_users = CLUSTER_USERS..2 * CLUSTER_USERS;
            let n = fault_users.filter(|&u| victims[&(via, u)]).count();
            assert!(n > 0 && n < CLUSTER_USERS, "{via:?}: {n} users on the victim");
        }

        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let load = Load::start(store.clone(), origin, CLUSTER_USERS, cluster_user);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fault_start = origin.elapsed();
        load.next_generation();
        tokio::task::block_in_place(|| cluster.nodes[2].stop());
        // Shorter than the cluster's node timeout (5 s): the other masters
        // keep serving their slots.
        tokio::time::sleep(FAULT).await;
        let undo_start = origin.elapsed();
        tokio::task::block_in_place(|| cluster.nodes[2].start_again());
        let restarted = origin.elapsed();
        // Back in service once the restarted master sees the cluster as ok.
        tokio::task::block_in_place(|| cluster_ok(&cluster.nodes[2]));
        let fault_end = origin.elapsed();
        load.next_generation();
        println!("cluster: master answers PING at {restarted:?}, cluster ok at {fault_end:?}");
        tokio::time::sleep(Duration::from_millis(1800)).await;
        let recs = load.finish().await;
        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_bounded(&recs);
        let (hit, spared): (Vec<Rec>, Vec<Rec>) =
            recs.iter().partition(|r| victims[&(r.via, r.user)]);
        let before = counts(phases.before(&recs));
        let hit_during = counts(phases.during(&hit));
        let spared_during = counts(phases.during(&spared));
        let after = counts(phases.recovered(&recs));
        println!("cluster: before {before:?}\ncluster: victim's keys during {hit_during:?}\ncluster: other keys during {spared_during:?}\ncluster: after {after:?}");
        for via in [Via::Open, Via::Closed, Via::Store] {
            assert_eq!(count(&before, via, 503), 0, "{via:?} failed before");
            assert_eq!(count(&after, via, 503), 0, "{via:?} failed after");
            // Keys on the surviving masters are served throughout.
            assert_eq!(count(&spared_during, via, 503), 0, "{via:?} on live masters");
            assert!(count(&spared_during, via, 200) + count(&spared_during, via, 429) > 0);
            let recovery = phases.recovery(&hit, via);
            assert!(
                recovery <= Duration::from_secs(1),
                "{via:?} on the restarted master recovered after {recovery:?}"
            );
        }
        // Keys on the dead master: per the fail mode.
        let total = |c: &BTreeMap<(Via, u16), u64>, via: Via| -> u64 {
            c.iter().filter(|((v, _), _)| *v == via).map(|(_, n)| n).sum()
        };
        // Every path saw the fault. A failing call may take the whole timeout,
        // so the count is bounded by TASKS × FAULT ÷ TIMEOUT over three paths
        // (about 20 each, 2 seen on a loaded machine); only its presence is
        // asserted, not a rate.
        for via in [Via::Open, Via::Closed, Via::Store] {
            assert!(total(&hit_during, via) >= 1, "{via:?}: {hit_during:?}");
        }
        assert_eq!(count(&hit_during, Via::Open, 200), total(&hit_during, Via::Open));
        assert_eq!(count(&hit_during, Via::Closed, 503), total(&hit_during, Via::Closed));
        assert_eq!(count(&hit_during, Via::Store, 503), total(&hit_during, Via::Store));
        assert_no_task_leak(baseline).await;
    });
}
