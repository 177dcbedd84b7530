//! With leases on, a hot key answers as without: the same transcript of
//! answers (hits_addend at its edges, shadow mode, `unlimited`, `/json`)
//! and the same statistics, each run on a `redis-server` of its own; the
//! memory fallback and an outage take over from leases in hand.

use std::time::{Duration, Instant};

use tonic_health::pb::health_check_response::ServingStatus;

use crate::health::until_status;
use crate::redis::redis_support::RedisServer;
use crate::support::*;

const CFG: &str = "domain: s\ndescriptors:\n  - key: hot\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n  - key: shadow\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: free\n    rate_limit:\n      unlimited: true\n";

/// Checks of a key before it leases (the crate's hot threshold is 64).
const WARM: usize = 100;

async fn start(redis: &RedisServer, leases: &str, extra: &[(&str, &str)]) -> Rls {
    let url = format!("127.0.0.1:{}", redis.port);
    let mut env = vec![
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TIMEOUT", "500ms"),
        ("RLS_LEASES", leases),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    env.extend_from_slice(extra);
    let rls = Rls::start(&[("s.yaml", CFG)], &env).await;
    let serving = until_status(rls.running().grpc_addr, ServingStatus::Serving).await;
    assert_eq!(serving, ServingStatus::Serving as i32);
    rls
}

/// Every answer of the script, and the statistics after.
async fn transcript(leases: &str) -> (Vec<String>, Vec<String>) {
    let redis = RedisServer::start();
    let mut rls = start(&redis, leases, &[]).await;
    let mut out = Vec::new();
    let edges = [0, 1, 900, 1_000, 1_001, u64::from(u32::MAX), u64::MAX];
    for hits in edges {
        let value = hits.to_string();
        let ask = |h: u64| {
            let r = request("s", vec![dh(&[("hot", &value)], h)]);
            let mut client = rls.client.clone();
            async move { client.should_rate_limit(r).await.unwrap().into_inner() }
        };
        for _ in 0..WARM {
            out.push(format!("{hits} warm {:?}", codes(&ask(1).await)));
        }
        for h in [hits, 1, 0, 1] {
            let c = codes(&ask(h).await);
            // A peek reads the counter, which counts what a lease holds.
            let c = if h == 0 { vec![(c[0].0, 0)] } else { c };
            out.push(format!("{hits} then {h}: {c:?}"));
        }
    }
    for key in ["shadow", "free"] {
        for _ in 0..150 {
            let r = rls.ask("s", vec![d(&[(key, "x")])]).await;
            out.push(format!("{key}: {} {:?}", r.overall_code, codes(&r)));
        }
    }
    let body = r#"{"domain":"s","descriptors":[{"entries":[{"key":"hot","value":"json"}]}]}"#;
    for _ in 0..1_100 {
        let (status, _, text) = http(rls.running().http_addr, "POST", "/json", body).await;
        out.push(format!("json {status} {text}"));
    }
    let (_, _, text) = http(rls.running().metrics_addr.unwrap(), "GET", "/metrics", "").await;
    let stats = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_"))
        .map(str::to_owned)
        .collect();
    rls.stop().await;
    (out, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_and_statistics_are_the_same_with_leases() {
    let (off, off_stats) = transcript("off").await;
    let (on, on_stats) = transcript("on").await;
    assert_eq!(on.len(), off.len());
    for (a, b) in on.iter().zip(&off) {
        assert_eq!(a, b, "with leases, then without");
    }
    assert!(
        off_stats.iter().any(|l| l.contains("over_limit")),
        "{off_stats:?}"
    );
    assert_eq!(on_stats, off_stats);
}

/// Makes `value` hot: leased from then on.
async fn warm(rls: &mut Rls, value: &str) {
    for _ in 0..WARM {
        let r = rls.ask("s", vec![d(&[("hot", value)])]).await;
        assert_eq!(codes(&r)[0].0, OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_ends_the_leases_and_health() {
    let mut redis = RedisServer::start();
    let mut rls = start(&redis, "on", &[]).await;
    warm(&mut rls, "v").await;
    redis.stop();
    // At most what the lease in hand holds (a block) is still served: its
    // units were charged on Redis before the outage.
    let mut failed = false;
    for _ in 0..=1_024 {
        if let Err(e) = rls.try_ask(request("s", vec![d(&[("hot", "v")])])).await {
            assert_eq!(e.code(), tonic::Code::Unavailable);
            failed = true;
            break;
        }
    }
    assert!(failed, "a lease outlived the outage");
    let grpc = rls.running().grpc_addr;
    let status = until_status(grpc, ServingStatus::NotServing).await;
    assert_eq!(status, ServingStatus::NotServing as i32);
    redis.start_again();
    let status = until_status(grpc, ServingStatus::Serving).await;
    assert_eq!(status, ServingStatus::Serving as i32);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match rls.try_ask(request("s", vec![d(&[("hot", "v")])])).await {
            // A new Redis: the count starts again.
            Ok(r) => break assert_eq!(codes(&r)[0].0, OK),
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rls.stop().await;
}

/// Admitted after Redis stopped, with a hot key leased before.
async fn through_the_fallback(leases: &str) -> u64 {
    let mut redis = RedisServer::start();
    let mut rls = start(&redis, leases, &[("RLS_REDIS_FALLBACK", "memory")]).await;
    warm(&mut rls, "v").await;
    redis.stop();
    // Every request answered, then over; bounded.
    let mut admitted = 0;
    for _ in 0..1_200 {
        let r = rls.ask("s", vec![d(&[("hot", "v")])]).await;
        admitted += u64::from(codes(&r)[0].0 == OK);
    }
    let r = rls.ask("s", vec![d(&[("hot", "v")])]).await;
    assert_eq!(codes(&r)[0].0, OVER);
    rls.stop().await;
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_fallback_decides_once_redis_is_down() {
    let off = through_the_fallback("off").await;
    let on = through_the_fallback("on").await;
    assert_eq!(on, off, "with leases, then without");
}

/// A lease short of a large hits_addend gives its counts back only while
/// they are the counter's last: after an upstream pod's `INCRBY` they lapse
/// (a `DECRBY` then would hand the pod's count out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_go_back_only_from_the_counters_tail() {
    use crate::shared_counters::{get, upstream_hit};
    let redis = RedisServer::start();
    let mut rls = start(&redis, "on", &[]).await;
    let mut conn = redis.conn();
    let key = |v: &str| format!("s_hot_{v}_{}", T0 / 3_600 * 3_600);
    for (value, pod) in [("tail", false), ("lapse", true)] {
        warm(&mut rls, value).await;
        let held = get(&mut conn, &key(value)).unwrap() - WARM as u64;
        assert!(held > 0, "{value}: a lease holds counts");
        if pod {
            upstream_hit(&mut conn, &key(value), 1, 3_600);
        }
        let r = rls.ask("s", vec![dh(&[("hot", value)], 850)]).await;
        let count = get(&mut conn, &key(value)).unwrap();
        if pod {
            assert_eq!(count, WARM as u64 + held + 1 + 850, "lapsed");
            let over = WARM as u64 + held + 1 + 850 > 1_000;
            assert_eq!(codes(&r)[0].0, if over { OVER } else { OK });
        } else {
            assert_eq!(count, WARM as u64 + 850, "given back");
            assert_eq!(codes(&r), vec![(OK, 50)]);
        }
    }
    rls.stop().await;
}

/// On a Redis Cluster too: the give-back script runs on the key's master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_go_back_on_a_cluster() {
    let (_cluster, nodes) = crate::redis::cluster().await;
    let env = [
        ("REDIS_URL", nodes.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
    ];
    let mut rls = Rls::start(&[("s.yaml", CFG)], &env).await;
    let serving = until_status(rls.running().grpc_addr, ServingStatus::Serving).await;
    assert_eq!(serving, ServingStatus::Serving as i32);
    for value in ["a", "b", "c", "d"] {
        warm(&mut rls, value).await;
        // Without the give-back the counts the lease held would count too.
        let r = rls.ask("s", vec![dh(&[("hot", value)], 850)]).await;
        assert_eq!(codes(&r), vec![(OK, 50)], "{value}");
    }
    rls.stop().await;
}
