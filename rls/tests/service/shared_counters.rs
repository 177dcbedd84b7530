//! Counters shared with upstream during a migration, on a real
//! `redis-server`: one key driven alternately through this server (gRPC)
//! and through the very commands an envoyproxy/ratelimit pod sends
//! (`src/redis/fixed_cache_impl.go`: `INCRBY key hits` then `EXPIRE key
//! unit + jitter`, pipelined) is one counter: the counts add up, OVER_LIMIT
//! falls on the request that passes the limit whichever side serves it,
//! the TTL is upstream's, and `CACHE_KEY_PREFIX` is the key's first bytes.

use std::collections::BTreeSet;

use ::redis::Connection;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::health::until_status;
use crate::redis::redis_support::RedisServer;
use crate::redis::start;
use crate::support::*;

// The same on a Redis Cluster.
mod cluster;

/// What an upstream pod sends for one descriptor: the count after.
pub fn upstream_hit(conn: &mut Connection, key: &str, hits: u64, ttl: u64) -> u64 {
    let (after,): (u64,) = ::redis::pipe()
        .cmd("INCRBY")
        .arg(key)
        .arg(hits)
        .cmd("EXPIRE")
        .arg(key)
        .arg(ttl)
        .ignore()
        .query(conn)
        .unwrap();
    after
}

pub fn ttl(conn: &mut Connection, key: &str) -> i64 {
    ::redis::cmd("TTL").arg(key).query(conn).unwrap()
}

pub fn get(conn: &mut Connection, key: &str) -> Option<u64> {
    ::redis::cmd("GET").arg(key).query(conn).unwrap()
}

fn keys(conn: &mut Connection, pattern: &str) -> BTreeSet<String> {
    ::redis::cmd("KEYS").arg(pattern).query(conn).unwrap()
}

/// `(side, hits)`: this server or an upstream pod.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    Rls,
    Upstream,
}

/// The steps of a migration on one key (limit 5): each side in turn, the
/// 6th hit from either, hits 0 (a check, which upstream counts as an
/// `INCRBY 0`) from both.
pub const STEPS: [(Side, u64); 10] = [
    (Side::Rls, 1),
    (Side::Upstream, 1),
    (Side::Rls, 2),
    (Side::Upstream, 1),
    (Side::Rls, 0),
    (Side::Upstream, 0),
    (Side::Rls, 1),
    (Side::Upstream, 1),
    (Side::Rls, 3),
    (Side::Upstream, 1),
];

/// Drives `STEPS` on `value`: after each, the key holds the sum, whichever
/// side answered; its TTL is the minute's (jitter 0).
pub async fn migrate(rls: &mut Rls, conn: &mut Connection, key: &str, value: &str) {
    let mut count = 0;
    for (i, (side, hits)) in STEPS.into_iter().enumerate() {
        count += hits;
        match side {
            Side::Rls => {
                let r = rls.ask("d", vec![dh(&[("k", value)], hits)]).await;
                let want = if count > 5 {
                    (OVER, 0)
                } else {
                    (OK, 5 - count as u32)
                };
                assert_eq!(codes(&r), vec![want], "step {i}: {side:?} {hits}");
            }
            Side::Upstream => {
                assert_eq!(upstream_hit(conn, key, hits, 60), count, "step {i}");
            }
        }
        assert_eq!(get(conn, key), Some(count), "step {i}: one counter");
        assert!(
            (59..=60).contains(&ttl(conn, key)),
            "step {i}: the minute's TTL"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_counter_for_upstream_pods_and_these() {
    let redis = RedisServer::start();
    let env = [
        ("CACHE_KEY_PREFIX", "mig:"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "0"),
    ];
    let mut rls = start(&redis, &env).await;
    let mut conn = redis.conn();
    let key = format!("mig:d_k_v_{T0}");
    migrate(&mut rls, &mut conn, &key, "v").await;
    assert_eq!(keys(&mut conn, "*d_k_v_*"), BTreeSet::from([key]));
    // An hour limit (a request's override) lives an hour.
    let r = rls.ask("d", vec![dl(&[("k", "o")], 10, HOUR)]).await;
    assert_eq!(codes(&r), vec![(OK, 9)]);
    assert!((3_599..=3_600).contains(&ttl(&mut conn, &format!("mig:d_k_o_{T0}"))));
    // The next window is a new key on both sides.
    rls.advance(60);
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!(codes(&r), vec![(OK, 4)]);
    let next = format!("mig:d_k_v_{}", T0 + 60);
    assert_eq!(upstream_hit(&mut conn, &next, 1, 60), 2);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_live_the_unit_plus_upstreams_jitter() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    // Unset: upstream's default of 300.
    for (jitter, top) in [(Some("10"), 69), (None, 359)] {
        let env: Vec<_> = jitter
            .map(|j| ("EXPIRATION_JITTER_MAX_SECONDS", j))
            .into_iter()
            .collect();
        let mut rls = start(&redis, &env).await;
        let mut seen = BTreeSet::new();
        for i in 0..40 {
            let value = format!("{jitter:?}-{i}");
            rls.ask("d", vec![d(&[("k", &value)])]).await;
            let t = ttl(&mut conn, &format!("d_k_{value}_{T0}"));
            assert!((59..=top).contains(&t), "jitter {jitter:?}: ttl {t}");
            seen.insert(t);
        }
        assert!(seen.len() > 1, "jitter {jitter:?}: every TTL {seen:?}");
        rls.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addends_at_their_edges_on_the_shared_counter() {
    let redis = RedisServer::start();
    let mut rls = start(&redis, &[("EXPIRATION_JITTER_MAX_SECONDS", "0")]).await;
    let mut conn = redis.conn();
    let key = |v: &str| format!("d_k_{v}_{T0}");
    // 0: a check, which upstream's INCRBY 0 makes a key of 0 with a TTL.
    let r = rls.ask("d", vec![dh(&[("k", "zero")], 0)]).await;
    assert_eq!(codes(&r), vec![(OK, 5)]);
    assert_eq!(get(&mut conn, &key("zero")), Some(0));
    assert!((59..=60).contains(&ttl(&mut conn, &key("zero"))));
    // The largest: counted as 2^40 (above any limit), over on both sides.
    let r = rls.ask("d", vec![dh(&[("k", "max")], u64::MAX)]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert_eq!(get(&mut conn, &key("max")), Some(1 << 40));
    assert!(upstream_hit(&mut conn, &key("max"), 1, 60) > 5);
    // A count upstream pods pushed to the top: full, over, no error.
    let top = (i64::MAX - 1) as u64;
    let _: () = ::redis::cmd("SET")
        .arg(key("top"))
        .arg(top)
        .query(&mut conn)
        .unwrap();
    let r = rls.ask("d", vec![dh(&[("k", "top")], 5)]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert_eq!(get(&mut conn, &key("top")), Some(top), "INCRBY refused");
    assert!(
        (59..=60).contains(&ttl(&mut conn, &key("top"))),
        "EXPIRE ran"
    );
    let r = rls.ask("d", vec![d(&[("k", "top")])]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    // Two identical descriptors in one request: two INCRBYs, in order.
    let twice = vec![d(&[("k", "two")]), d(&[("k", "two")]), d(&[("tight", "t")])];
    let r = rls.ask("d", twice).await;
    assert_eq!(codes(&r), vec![(OK, 4), (OK, 3), (OK, 0)]);
    assert_eq!(get(&mut conn, &key("two")), Some(2));
    assert_eq!(get(&mut conn, &format!("d_tight_t_{T0}")), Some(1));
    rls.stop().await;
}

/// Where `INCRBY` cannot say it, or the old keys are asked for, the crate's
/// keys and scripts count: `throttle:{tag}:<algorithm>:=` before the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_keys_when_asked_for_and_beyond_incrby() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let modes = [
        ("crate", vec![("RLS_REDIS_KEYS", "crate")]),
        (
            "stop",
            vec![("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
        ),
        ("aon", vec![("RLS_ALL_OR_NOTHING", "true")]),
    ];
    for (name, env) in modes {
        let mut rls = start(&redis, &env).await;
        rls.ask("d", vec![d(&[("k", name)])]).await;
        let found = keys(&mut conn, &format!("*d_k_{name}_*"));
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        let k = found.first().unwrap();
        assert!(k.starts_with("throttle:") && k.ends_with(&format!("=d_k_{name}_{T0}")));
        rls.stop().await;
    }
    // The extension algorithms keep theirs by default too.
    let mut rls = start(&redis, &[]).await;
    rls.ask("d", vec![d(&[("g", "x")])]).await;
    let found = keys(&mut conn, "*d_g_x*");
    assert!(
        found.iter().all(|k| k.ends_with("=d_g_x_gcra")),
        "{found:?}"
    );
    assert_eq!(found.len(), 1);
    rls.stop().await;
}

/// Checks (hits 0) until one reaches Redis, which upstream's `INCRBY 0`
/// shows as the key: the fallback sends calls back to Redis once a probe
/// (within a second) finds it answering. Bounded.
async fn until_on_redis(rls: &mut Rls, redis: &RedisServer, key: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut conn = redis.conn();
    while get(&mut conn, key).is_none() {
        assert!(std::time::Instant::now() < deadline, "never on Redis");
        rls.ask("d", vec![dh(&[("k", "v")], 0)]).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `RLS_REDIS_FALLBACK=memory`: while Redis is down the memory store
/// decides (a count of its own); once Redis answers again, counting is
/// back on upstream's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_fallback_decides_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let mut rls = start(&redis, &[("RLS_REDIS_FALLBACK", "memory")]).await;
    let key = format!("d_k_v_{T0}");
    until_on_redis(&mut rls, &redis, &key).await;
    upstream_hit(&mut redis.conn(), &key, 3, 60);
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!(codes(&r), vec![(OK, 1)], "the shared count");
    redis.stop();
    let r = rls.ask("d", vec![dh(&[("k", "v")], 5)]).await;
    assert_eq!(codes(&r), vec![(OK, 0)], "the fallback's own count");
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)], "the fallback's own limit");
    redis.start_again();
    until_on_redis(&mut rls, &redis, &key).await;
    let mut conn = redis.conn();
    assert_eq!(upstream_hit(&mut conn, &key, 1, 60), 1, "a restarted Redis");
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!(codes(&r), vec![(OK, 3)], "upstream's key again");
    rls.stop().await;
}

#[test]
fn the_settings_of_the_keys_and_their_jitter() {
    use throttle_rls::settings::{RedisKeys, Settings};
    fn of(vars: &[(&str, &str)]) -> Result<Settings, throttle_rls::settings::SettingsError> {
        Settings::from_lookup(&|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }
    let s = of(&[]).unwrap();
    assert_eq!(
        (s.redis_keys, s.expiration_jitter_max_seconds),
        (RedisKeys::Upstream, 300)
    );
    let s = of(&[
        ("RLS_REDIS_KEYS", "crate"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "-3"),
    ])
    .unwrap();
    assert_eq!(
        (s.redis_keys, s.expiration_jitter_max_seconds),
        (RedisKeys::Crate, 0)
    );
    let e = of(&[("RLS_REDIS_KEYS", "throttle")]).unwrap_err();
    assert_eq!(e.name, "RLS_REDIS_KEYS");
    let e = of(&[("EXPIRATION_JITTER_MAX_SECONDS", "5m")]).unwrap_err();
    assert_eq!(e.name, "EXPIRATION_JITTER_MAX_SECONDS");
    // 1 is the least jitter; 10^15 s the most, far below the expiry Redis
    // refuses (about 9.2e15 s); beyond, refused before any counting fails.
    for (raw, jitter) in [
        ("1", Some(1)),
        ("1000000000000000", Some(1_000_000_000_000_000)),
    ]
    .into_iter()
    .chain([("1000000000000001", None), ("9223372036854775807", None)])
    {
        let s = of(&[("EXPIRATION_JITTER_MAX_SECONDS", raw)]);
        assert_eq!(
            s.map(|s| s.expiration_jitter_max_seconds).ok(),
            jitter,
            "{raw}"
        );
    }
    let e = of(&[("EXPIRATION_JITTER_MAX_SECONDS", "9223372036854775808")]).unwrap_err();
    assert_eq!(e.name, "EXPIRATION_JITTER_MAX_SECONDS");
}

const STATS: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: s\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    shadow_mode: true\n";

/// Near-limit, over-limit and shadow-mode statistics, and shadow mode's
/// answer, from the shared count: what upstream pods added counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_and_shadow_mode_read_the_shared_count() {
    let redis = RedisServer::start();
    let url = format!("127.0.0.1:{}", redis.port);
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    let mut rls = Rls::start(&[("d.yaml", STATS)], &env).await;
    let serving = until_status(rls.running().grpc_addr, ServingStatus::Serving).await;
    assert_eq!(serving, ServingStatus::Serving as i32);
    let mut conn = redis.conn();
    let key = format!("d_k_v_{T0}");
    upstream_hit(&mut conn, &key, 3, 60);
    // 3 → 5: within, and 1 near (past 4 = 0.8 × 5).
    let r = rls.ask("d", vec![dh(&[("k", "v")], 2)]).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    upstream_hit(&mut conn, &key, 1, 60);
    // 6 → 7: over.
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    // Shadow mode: over by the shared count, answered OK.
    upstream_hit(&mut conn, &format!("d_s_x_{T0}"), 1, 60);
    let r = rls.ask("d", vec![d(&[("s", "x")])]).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    let addr = rls.running().metrics_addr.unwrap();
    let (_, _, text) = http(addr, "GET", "/metrics", "").await;
    for (stat, key1, n) in [
        ("total_hits", "k", 3),
        ("within_limit", "k", 2),
        ("near_limit", "k", 1),
        ("over_limit", "k", 1),
        ("over_limit", "s", 1),
        ("shadow_mode", "s", 1),
    ] {
        let line =
            format!(r#"ratelimit_service_rate_limit_{stat}{{domain="d",key1="{key1}"}} {n}"#);
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
    rls.stop().await;
}
