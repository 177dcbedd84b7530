//! The same answers on a real `redis-server` (started on a free port),
//! through the crate's Redis store; health follows Redis.

#[path = "../../../tests/support/redis.rs"]
pub mod redis_support;

use std::time::{Duration, Instant};

use redis_support::{free_port, RedisCluster, RedisServer};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::health::until_status;
use crate::support::*;

pub const CFG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: tight\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: g\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra, burst: 1}\n";

pub async fn start(redis: &RedisServer, extra: &[(&str, &str)]) -> Rls {
    let url = format!("127.0.0.1:{}", redis.port);
    let mut env = vec![
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TIMEOUT", "500ms"),
    ];
    env.extend_from_slice(extra);
    start_env(&env).await
}

/// A Redis Cluster of its own, and upstream's `REDIS_URL` for it: its
/// nodes, comma-separated.
pub async fn cluster() -> (RedisCluster, String) {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap();
    let nodes = (cluster.nodes.iter())
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect::<Vec<_>>()
        .join(",");
    (cluster, nodes)
}

/// A `redis-server` serving TLS on a port of its own with `cert`, `key`
/// and `ca` (paths); `auth_clients`: client certificates required. Its
/// port, and the server (stopped on drop).
pub fn tls_server(cert: &str, key: &str, ca: &str, auth_clients: bool) -> (u16, RedisServer) {
    let tls_port = free_port(false);
    let args: Vec<String> = [
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        cert,
        "--tls-key-file",
        key,
        "--tls-ca-cert-file",
        ca,
        "--tls-auth-clients",
        if auth_clients { "yes" } else { "no" },
    ]
    .map(String::from)
    .to_vec();
    (tls_port, RedisServer::start_with_args(&args))
}

/// A server on the Redis `env` describes, once its health says SERVING.
pub async fn start_env(env: &[(&str, &str)]) -> Rls {
    let rls = Rls::start(&[("d.yaml", CFG)], env).await;
    assert_eq!(
        until_status(rls.running().grpc_addr, ServingStatus::Serving).await,
        ServingStatus::Serving as i32
    );
    rls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_counting_on_redis() {
    let redis = RedisServer::start();
    let mut rls = start(&redis, &[]).await;
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 0)]).await),
        vec![(OVER, 0)],
        "rejected hits counted"
    );
    rls.advance(60);
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OK, 4)]
    );
    // GCRA through Redis scripts.
    let g = || vec![d(&[("g", "x")])];
    assert_eq!(codes(&rls.ask("d", g()).await), vec![(OK, 1)]);
    assert_eq!(codes(&rls.ask("d", g()).await), vec![(OK, 0)]);
    assert_eq!(codes(&rls.ask("d", g()).await), vec![(OVER, 0)]);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_keys_are_built_as_upstream_builds_them() {
    let redis = RedisServer::start();
    let mut rls = start(&redis, &[("CACHE_KEY_PREFIX", "pfx:")]).await;
    rls.advance(75);
    rls.ask("d", vec![d(&[("k", "v")])]).await;
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .unwrap();
    // Upstream's key, as is: no prefix, tag or algorithm of the crate's.
    let want = format!("pfx:d_k_v_{}", T0 + 60);
    assert!(keys.contains(&want), "no key {want} in {keys:?}");
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_on_redis() {
    let redis = RedisServer::start();
    let mut rls = start(
        &redis,
        &[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")],
    )
    .await;
    let both = || vec![d(&[("tight", "x")]), d(&[("k", "x")])];
    assert_eq!(codes(&rls.ask("d", both()).await), vec![(OK, 0), (OK, 4)]);
    assert_eq!(codes(&rls.ask("d", both()).await), vec![(OVER, 0), (OK, 4)]);
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "x")])]).await),
        vec![(OK, 3)]
    );
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_redis_and_errors_name_nothing_internal() {
    let mut redis = RedisServer::start();
    let mut rls = start(&redis, &[]).await;
    let grpc = rls.running().grpc_addr;
    redis.stop();
    let e = rls
        .try_ask(request("d", vec![d(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (tonic::Code::Unavailable, "rate limit store unavailable")
    );
    assert_eq!(
        until_status(grpc, ServingStatus::NotServing).await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        http(rls.running().http_addr, "GET", "/healthcheck", "")
            .await
            .0,
        500
    );
    redis.start_again();
    assert_eq!(
        until_status(grpc, ServingStatus::Serving).await,
        ServingStatus::Serving as i32
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rls.try_ask(request("d", vec![d(&[("k", "v")])])).await {
            Ok(r) => break assert_eq!(codes(&r), vec![(OK, 4)]),
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_to_memory_keeps_answering() {
    let mut redis = RedisServer::start();
    let mut rls = start(&redis, &[("RLS_REDIS_FALLBACK", "memory")]).await;
    redis.stop();
    for i in 1..=5u32 {
        assert_eq!(
            codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
            vec![(OK, 5 - i)]
        );
    }
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OVER, 0)]
    );
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_unhealthy_until_redis_answers() {
    let port = redis_support::free_port(false);
    let url = format!("127.0.0.1:{port}");
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TIMEOUT", "500ms"),
    ];
    let mut rls = Rls::start(&[("d.yaml", CFG)], &env).await;
    let grpc = rls.running().grpc_addr;
    assert_eq!(
        crate::health::grpc_status(grpc, "ratelimit").await,
        ServingStatus::NotServing as i32
    );
    assert_eq!(
        http(rls.running().http_addr, "GET", "/healthcheck", "")
            .await
            .0,
        500
    );
    let e = rls
        .try_ask(request("d", vec![d(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    let _redis = RedisServer::start_on(port, &[]);
    assert_eq!(
        until_status(grpc, ServingStatus::Serving).await,
        ServingStatus::Serving as i32
    );
    rls.stop().await;
}

/// A limit the Redis store cannot count (a GCRA tolerance of 50 days or
/// more, a sliding log above 10,000 a window) is a refused configuration,
/// as a bad file is: the table in force stays, `/rlconfig` says why, and no
/// request ever meets the refusal. Just inside the bounds, the reload takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_redis_cannot_count_is_refused_at_reload() {
    let redis = RedisServer::start();
    let mut rls = start(&redis, &[]).await;
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "x")])]).await),
        vec![(OK, 4)]
    );
    let with =
        |limit: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n");
    for (limit, why) in [
        (
            "{unit: year, requests_per_unit: 1, algorithm: gcra}",
            "50 days",
        ),
        (
            "{unit: month, requests_per_unit: 1, algorithm: gcra, max_burst: 1}",
            "50 days",
        ),
        (
            "{unit: minute, requests_per_unit: 10001, algorithm: sliding_log}",
            "10,000",
        ),
    ] {
        let err = rls.rewrite("d.yaml", &with(limit)).await.unwrap_err();
        assert!(
            err.contains("d.k")
                && err.contains("the store cannot count this limit")
                && err.contains(why),
            "{limit}: {err}"
        );
        // The table in force still counts.
        assert_eq!(codes(&rls.ask("d", vec![d(&[("k", "x")])]).await).len(), 1);
        let (_, _, dump) = http(rls.running().debug_addr, "GET", "/rlconfig", "").await;
        assert!(
            dump.contains("d.k: unit=MINUTE requests_per_unit=5"),
            "{dump}"
        );
        assert!(
            dump.contains("previous configuration kept") && dump.contains(why),
            "{dump}"
        );
    }
    // Inside the bounds: 5 a month (a tolerance of 6 days), 10,000 a minute.
    for limit in [
        "{unit: month, requests_per_unit: 5, algorithm: gcra}",
        "{unit: minute, requests_per_unit: 10000, algorithm: sliding_log}",
    ] {
        rls.rewrite("d.yaml", &with(limit)).await.unwrap();
        assert_eq!(
            codes(&rls.ask("d", vec![d(&[("k", "y")])]).await)[0].0,
            OK,
            "{limit}"
        );
    }
    rls.stop().await;
}
