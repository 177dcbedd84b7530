//! Counters shared with upstream on a real Redis Cluster (three masters):
//! upstream's keys as is, no hash tag (as upstream's radix client sends
//! them), each on the master serving its own slot; one key driven
//! alternately through this server and through upstream's commands sent
//! to that master is one counter.

use ::redis::Connection;

use super::{get, migrate, ttl, upstream_hit};
use crate::redis::redis_support::RedisCluster;
use crate::redis::start_env;
use crate::support::*;

/// The master serving `key`'s slot, as a cluster client routes `key`.
fn owner(cluster: &RedisCluster, key: &str) -> (usize, Connection) {
    let slot: u16 = ::redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut cluster.nodes[0].conn())
        .unwrap();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let mut conn = node.conn();
        let nodes: String = ::redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut conn)
            .unwrap();
        let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
        let serves = me.split_whitespace().skip(8).any(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
        });
        if serves {
            return (i, conn);
        }
    }
    panic!("no master serves slot {slot}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_counter_with_upstream_on_a_cluster() {
    let (cluster, nodes) = crate::redis::cluster().await;
    let env = [
        ("REDIS_URL", nodes.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
        ("CACHE_KEY_PREFIX", "mig:"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0"),
    ];
    let mut rls = start_env(&env).await;
    let mut masters = std::collections::BTreeSet::new();
    // Values whose slots fall on more than one master.
    for i in 0..6 {
        let value = format!("v{}", i * 7_919);
        let key = format!("mig:d_k_{value}_{T0}");
        let (node, mut conn) = owner(&cluster, &key);
        masters.insert(node);
        migrate(&mut rls, &mut conn, &key, &value).await;
    }
    assert!(masters.len() > 1, "the keys spread over the masters");
    // One request over several slots: every key counted on its master.
    let values: Vec<String> = (0..6).map(|i| format!("w{}", i * 7_919)).collect();
    let many = values.iter().map(|v| d(&[("k", v)])).collect();
    assert_eq!(codes(&rls.ask("d", many).await), vec![(OK, 4); 6]);
    for v in &values {
        let key = format!("mig:d_k_{v}_{T0}");
        let (_, mut conn) = owner(&cluster, &key);
        assert_eq!(get(&mut conn, &key), Some(1), "{key}");
        assert!((59..=60).contains(&ttl(&mut conn, &key)));
        assert_eq!(upstream_hit(&mut conn, &key, 4, 60), 5);
    }
    let many = values.iter().map(|v| d(&[("k", v)])).collect();
    assert_eq!(codes(&rls.ask("d", many).await), vec![(OVER, 0); 6]);
    rls.stop().await;
}
