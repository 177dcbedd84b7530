//! The service on a real Redis Cluster (three masters): each descriptor's
//! counter is the key upstream builds, as is (no hash tag, as upstream's),
//! on the master serving its slot, holding the request's hits; in
//! all-or-nothing mode the crate's keys, and a request's share one slot.

use ::redis::Connection;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;

use crate::redis::redis_support::RedisCluster;
use crate::redis::start_env;
use crate::support::*;

/// The slot ranges the node behind `conn` serves (its `myself` line).
fn served_slots(conn: &mut Connection) -> Vec<(u16, u16)> {
    let nodes: String = ::redis::cmd("CLUSTER").arg("NODES").query(conn).unwrap();
    let me = nodes.lines().find(|l| l.contains("myself")).unwrap();
    me.split_whitespace()
        .skip(8)
        .filter_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

fn keyslot(conn: &mut Connection, key: &[u8]) -> u16 {
    ::redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(conn)
        .unwrap()
}

/// Where one counter is.
struct Found {
    node: usize,
    key: Vec<u8>,
    slot: u16,
}

/// The one key on the cluster that is `user` (upstream's) or ends with
/// `=` + `user` (the crate's): held by exactly one node, which serves its
/// slot, and whose slot is its hash tag's if it has one.
fn locate(cluster: &RedisCluster, user: &str) -> Found {
    let want = format!("={user}").into_bytes();
    let mut found = Vec::new();
    for (node, server) in cluster.nodes.iter().enumerate() {
        let keys: Vec<Vec<u8>> = ::redis::cmd("KEYS")
            .arg("*")
            .query(&mut server.conn())
            .unwrap();
        found.extend(
            keys.into_iter()
                .filter(|k| k.ends_with(&want) || k == user.as_bytes())
                .map(|key| (node, key)),
        );
    }
    assert_eq!(found.len(), 1, "keys ending {user}: {found:?}");
    let (node, key) = found.pop().unwrap();
    let mut conn = cluster.nodes[node].conn();
    let slot = keyslot(&mut conn, &key);
    assert!(
        served_slots(&mut conn)
            .iter()
            .any(|(a, b)| (*a..=*b).contains(&slot)),
        "{user} is on node {node}, which does not serve slot {slot}"
    );
    if let Some(open) = key.iter().position(|b| *b == b'{') {
        let close = open + key[open..].iter().position(|b| *b == b'}').unwrap();
        assert_eq!(
            keyslot(&mut conn, &key[open..=close]),
            slot,
            "the tag names the slot"
        );
    }
    Found { node, key, slot }
}

/// A fixed window's stored count: packed `index·2^20 + count`, or
/// `index:count`.
fn count(cluster: &RedisCluster, f: &Found) -> u64 {
    let v: String = ::redis::cmd("GET")
        .arg(&f.key)
        .query(&mut cluster.nodes[f.node].conn())
        .unwrap();
    match v.split_once(':') {
        Some((_, c)) => c.parse().unwrap(),
        None => v.parse::<u64>().unwrap() % (1 << 20),
    }
}

/// The values of `k` with 1, 2, ... hits, `tight` once, `g` (GCRA) once.
fn many(values: &[String]) -> Vec<RateLimitDescriptor> {
    let mut out: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| dh(&[("k", v)], i as u64 + 1))
        .collect();
    out.push(d(&[("tight", "x")]));
    out.push(d(&[("g", "y")]));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_land_on_upstream_keys_in_their_slots_on_a_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let nodes = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect::<Vec<_>>()
        .join(",");
    let values: Vec<String> = (1..=8).map(|i| format!("v{i}")).collect();
    let want: Vec<(i32, u32)> = (1..=8)
        .map(|i| if i <= 5 { (OK, 5 - i) } else { (OVER, 0) })
        .chain([(OK, 0), (OK, 1)])
        .collect();

    // Upstream's counting: one check per descriptor, each key in its own slot.
    let env = [
        ("REDIS_URL", nodes.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
        ("CACHE_KEY_PREFIX", "each:"),
    ];
    let mut rls = start_env(&env).await;
    assert_eq!(codes(&rls.ask("d", many(&values)).await), want);
    let mut on_nodes = std::collections::BTreeSet::new();
    for (i, v) in values.iter().enumerate() {
        let f = locate(&cluster, &format!("each:d_k_{v}_{T0}"));
        assert_eq!(
            f.key,
            format!("each:d_k_{v}_{T0}").into_bytes(),
            "upstream's key"
        );
        assert_eq!(count(&cluster, &f), i as u64 + 1, "rejected hits count too");
        on_nodes.insert(f.node);
    }
    assert!(
        on_nodes.len() > 1,
        "one key a slot: spread over the masters"
    );
    let tight = locate(&cluster, &format!("each:d_tight_x_{T0}"));
    locate(&cluster, "each:d_g_y_gcra");
    // Over after the limit, and the refused hit still counted.
    let over = vec![d(&[("tight", "x")]), d(&[("k", "v1")])];
    assert_eq!(codes(&rls.ask("d", over).await), vec![(OVER, 0), (OK, 3)]);
    assert_eq!(count(&cluster, &tight), 2);
    assert_eq!(
        count(&cluster, &locate(&cluster, &format!("each:d_k_v1_{T0}"))),
        2
    );
    rls.stop().await;

    // All or nothing: one atomic script, so every key in one slot.
    let mut env = env.to_vec();
    env[3] = ("CACHE_KEY_PREFIX", "all:");
    env.push(("RLS_ALL_OR_NOTHING", "true"));
    let mut rls = start_env(&env).await;
    let fits: Vec<_> = values[..5].to_vec();
    let r = rls.ask("d", many(&fits)).await;
    assert_eq!(
        codes(&r),
        want[..5]
            .iter()
            .copied()
            .chain([(OK, 0), (OK, 1)])
            .collect::<Vec<_>>()
    );
    let mut slots = std::collections::BTreeSet::new();
    let mut found = Vec::new();
    for v in &fits {
        let f = locate(&cluster, &format!("all:d_k_{v}_{T0}"));
        slots.insert(f.slot);
        found.push(f);
    }
    slots.insert(locate(&cluster, &format!("all:d_tight_x_{T0}")).slot);
    slots.insert(locate(&cluster, "all:d_g_y_gcra").slot);
    assert_eq!(slots.len(), 1, "one slot for a request's keys");
    // `tight` is now full: the request is refused and charges nothing.
    let r = rls.ask("d", many(&fits)).await;
    assert_eq!(r.overall_code, OVER);
    for (i, f) in found.iter().enumerate() {
        assert_eq!(count(&cluster, f), i as u64 + 1, "nothing charged");
    }
    rls.stop().await;
}
