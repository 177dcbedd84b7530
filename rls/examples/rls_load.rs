//! `ShouldRateLimit` requests/s and latency over loopback: throttle-rls
//! beside a bare tonic `RateLimitService` (a constant answer, same proto,
//! same client) and beside the crate's direct API on the same store, with
//! 64 calls in flight on one HTTP/2 connection, on the memory store and on
//! a `redis-server` started on a free port (skipped if none is on PATH).
//!
//! `cargo run --release -p tower-throttle-rls --example rls_load [-- ROUNDS SECONDS]`
//!
//! The gRPC contenders (bare tonic, throttle-rls on memory, on Redis) run
//! in rotating order over ROUNDS rounds (default 7) of SECONDS each
//! (default 2), so a drifting machine drifts under all of them; each row is
//! the median of its rounds, and its ratio to bare tonic the median of the
//! per-round ratios with quartiles. The direct API rows run once after.
//!
//! `-- hot [ROUNDS] [SECONDS]`: one hot descriptor (every request the same
//! key, as a per-route global limit): the memory store beside Redis with
//! leases (`RLS_LEASES=on`) and without, interleaved in rotating order over
//! ROUNDS rounds (default 9) of SECONDS each (default 2); the median and
//! quartiles of the per-round ratios to the memory store.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use throttle_rls::backend::TestHooks;
use throttle_rls::settings::Settings;
use tower_throttle::store::{BoxStore, Charge, Store};
use tower_throttle::{MemoryStore, Policy, RedisStore};

const IN_FLIGHT: usize = 64;
const KEYS: usize = 1_000;

struct Bare;

#[tonic::async_trait]
impl RateLimitService for Bare {
    async fn should_rate_limit(
        &self,
        r: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = r.into_inner().descriptors.len();
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok; n],
            ..Default::default()
        }))
    }
}

/// Requests per second, p50 and p99 of `call` run by 64 tasks for `secs`.
async fn load<F, Fut>(secs: u64, call: F) -> (f64, Duration, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let end = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut times = Vec::new();
                let mut i = t;
                while Instant::now() < end {
                    let start = Instant::now();
                    call(i % KEYS).await;
                    times.push(start.elapsed());
                    i += IN_FLIGHT;
                }
                times
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let pick = |q: f64| {
        all.get(((all.len() as f64) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    (all.len() as f64 / secs as f64, pick(0.5), pick(0.99))
}

/// `i` below `KEYS`: one of the users; `HOT`: the one hot route.
const HOT: usize = usize::MAX;

fn request(i: usize) -> RateLimitRequest {
    if i == HOT {
        return RateLimitRequest {
            domain: "bench".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "route".into(),
                    value: "all".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
    }
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: format!("u{i}"),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// `hot`: every request the hot route.
async fn grpc_load_of(addr: SocketAddr, secs: u64, hot: bool) -> (f64, Duration, Duration) {
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    load(secs, move |i| {
        let mut c = client.clone();
        let i = if hot { HOT } else { i };
        async move {
            let r = c.should_rate_limit(request(i)).await.unwrap().into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32);
        }
    })
    .await
}

async fn throttle_rls(redis: Option<u16>, leases: &str) -> throttle_rls::server::Running {
    let dir = std::env::temp_dir().join(format!("rls-load-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(
        dir.join("config/bench.yaml"),
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n  - key: route\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n",
    )
    .unwrap();
    let url = redis.map(|p| format!("127.0.0.1:{p}"));
    let root = dir.to_str().unwrap().to_owned();
    let leases = leases.to_owned();
    let settings = Settings::from_lookup(&move |name| {
        Some(match name {
            "RUNTIME_ROOT" => root.clone(),
            "RUNTIME_WATCH_ROOT" => "false".into(),
            "GRPC_HOST" | "HOST" | "DEBUG_HOST" => "127.0.0.1".into(),
            "GRPC_PORT" | "PORT" | "DEBUG_PORT" => "0".into(),
            "REDIS_URL" => url.clone()?,
            "REDIS_SOCKET_TYPE" => "tcp".into(),
            "RLS_LEASES" if url.is_some() => leases.clone(),
            // Statsd is on by default, as upstream; nothing listens here.
            "USE_STATSD" => "false".into(),
            _ => return None,
        })
    })
    .unwrap();
    throttle_rls::server::start(&settings, TestHooks::default())
        .await
        .unwrap()
}

async fn bare() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Bare))
            .serve_with_incoming(incoming),
    );
    addr
}

async fn direct(store: BoxStore, secs: u64) -> (f64, Duration, Duration) {
    let policy = Policy::fixed_window(1 << 50, Duration::from_secs(1)).unwrap();
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..KEYS)
            .map(|i| format!("bench_user_u{i}_").into_bytes())
            .collect(),
    );
    load(secs, move |i| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            store
                .check(Charge::new(&keys[i], &policy, 1))
                .await
                .unwrap();
        }
    })
    .await
}

fn row(name: &str, (rps, p50, p99): (f64, Duration, Duration)) {
    let us = |d: Duration| d.as_nanos() as f64 / 1_000.0;
    println!("| {name} | {rps:.0} | {:.1} | {:.1} |", us(p50), us(p99));
}

/// A `redis-server` on a free port, or `None` if there is none on PATH.
fn redis_server() -> Option<(std::process::Child, u16)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .ok()?;
    Some((child, port))
}

/// Until the service's own Redis connection answers (bounded: 30 s).
async fn ready(grpc: SocketAddr) {
    let end = Instant::now() + Duration::from_secs(30);
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    while client.should_rate_limit(request(0)).await.is_err() {
        assert!(Instant::now() < end, "Redis did not answer within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sorted `v`'s value at quantile `q`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Each contender's figures, round by round, the contenders in rotating
/// order (no contender always runs first or last).
async fn interleaved(
    addrs: &[SocketAddr],
    rounds: usize,
    secs: u64,
    hot: bool,
) -> Vec<Vec<(f64, Duration, Duration)>> {
    let mut figures = vec![Vec::new(); addrs.len()];
    for round in 0..rounds {
        for i in 0..addrs.len() {
            let c = (round + i) % addrs.len();
            figures[c].push(grpc_load_of(addrs[c], secs, hot).await);
        }
    }
    figures
}

/// One row per contender: median requests/s, p50 and p99 of its rounds, and
/// the median [quartiles] of its per-round ratios to the first contender.
fn report(title: &str, names: &[&str], figures: &[Vec<(f64, Duration, Duration)>]) {
    println!("| {title} | requests/s (median) | p50 µs | p99 µs | ÷ {}: median [q1, q3] |\n|---|---:|---:|---:|---|", names[0]);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        quantile(&v, 0.5)
    };
    let us = |d: &Duration| d.as_nanos() as f64 / 1_000.0;
    for (c, name) in names.iter().enumerate() {
        let mut ratios: Vec<f64> = (figures[c].iter().zip(&figures[0]))
            .map(|(a, first)| a.0 / first.0)
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} | {:.2} [{:.2}, {:.2}] |",
            median(figures[c].iter().map(|f| f.0).collect()),
            median(figures[c].iter().map(|f| us(&f.1)).collect()),
            median(figures[c].iter().map(|f| us(&f.2)).collect()),
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75)
        );
    }
}

/// The hot-descriptor comparison: see the module docs.
async fn hot(rounds: usize, secs: u64) {
    let Some((mut redis, port)) = redis_server() else {
        println!("(no redis-server on PATH)");
        return;
    };
    let servers = [
        throttle_rls(None, "off").await,
        throttle_rls(Some(port), "on").await,
        throttle_rls(Some(port), "off").await,
    ];
    let names = [
        "throttle-rls, memory store",
        "throttle-rls, Redis, RLS_LEASES=on",
        "throttle-rls, Redis, RLS_LEASES=off",
    ];
    for s in &servers {
        ready(s.grpc_addr).await;
        // Warm: connections, and the key hot enough to lease.
        grpc_load_of(s.grpc_addr, 1, true).await;
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.grpc_addr).collect();
    let figures = interleaved(&addrs, rounds, secs, true).await;
    let title = format!("one hot descriptor, {IN_FLIGHT} in flight, {rounds} rounds × {secs} s");
    report(&title, &names, &figures);
    let _ = redis.kill();
    let _ = redis.wait();
}

/// Many keys: bare tonic beside throttle-rls on memory and on Redis
/// (interleaved), then the direct API on the same stores.
async fn keys(rounds: usize, secs: u64) {
    let redis = redis_server();
    let mut names = vec!["bare tonic RateLimitService", "throttle-rls, memory store"];
    // Kept until the end: a dropped `Running` stops its server.
    let mut servers = vec![throttle_rls(None, "off").await];
    let mut addrs = vec![bare().await, servers[0].grpc_addr];
    if let Some((_, port)) = &redis {
        let rls = throttle_rls(Some(*port), "off").await;
        ready(rls.grpc_addr).await;
        names.push("throttle-rls, Redis (RLS_LEASES=off)");
        addrs.push(rls.grpc_addr);
        servers.push(rls);
    }
    for addr in &addrs {
        grpc_load_of(*addr, 1, false).await;
    }
    let figures = interleaved(&addrs, rounds, secs, false).await;
    let title = format!("{IN_FLIGHT} in flight, {KEYS} keys, {rounds} rounds × {secs} s");
    report(&title, &names, &figures);
    println!("\n| direct API, {secs} s | requests/s | p50 µs | p99 µs |\n|---|---|---|---|");
    row(
        "direct API, memory store",
        direct(BoxStore::new(MemoryStore::new()), secs).await,
    );
    let Some((mut redis, port)) = redis else {
        println!("(no redis-server on PATH: Redis rows skipped)");
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let store = loop {
        match RedisStore::builder().connect(url.as_str()).await {
            Ok(s) => break s,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    row(
        "direct API, Redis",
        direct(BoxStore::new(store), secs).await,
    );
    let _ = redis.kill();
    let _ = redis.wait();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if args.first().map(String::as_str) == Some("hot") {
        let rounds = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(9).max(1);
        let secs = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
        return rt.block_on(hot(rounds, secs));
    }
    let rounds = args
        .first()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
        .max(1);
    let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
    rt.block_on(keys(rounds, secs));
}
