//! `ShouldRateLimit` requests/s and latency over loopback: throttle-rls
//! beside a bare tonic `RateLimitService` (a constant answer, same proto,
//! same client) and beside the crate's direct API on the same store, with
//! 64 calls in flight on one HTTP/2 connection, on the memory store and on
//! a `redis-server` started on a free port (skipped if none is on PATH).
//!
//! `cargo run --release -p tower-throttle-rls --example rls_load [-- SECONDS]`

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

fn request(i: usize) -> RateLimitRequest {
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

async fn grpc_load(addr: SocketAddr, secs: u64) -> (f64, Duration, Duration) {
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    load(secs, move |i| {
        let mut c = client.clone();
        async move {
            let r = c.should_rate_limit(request(i)).await.unwrap().into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32);
        }
    })
    .await
}

async fn throttle_rls(redis: Option<u16>) -> throttle_rls::server::Running {
    let dir = std::env::temp_dir().join(format!("rls-load-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("config")).unwrap();
    std::fs::write(
        dir.join("config/bench.yaml"),
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n",
    )
    .unwrap();
    let url = redis.map(|p| format!("127.0.0.1:{p}"));
    let root = dir.to_str().unwrap().to_owned();
    let settings = Settings::from_lookup(&move |name| {
        Some(match name {
            "RUNTIME_ROOT" => root.clone(),
            "RUNTIME_WATCH_ROOT" => "false".into(),
            "GRPC_HOST" | "HOST" | "DEBUG_HOST" => "127.0.0.1".into(),
            "GRPC_PORT" | "PORT" | "DEBUG_PORT" => "0".into(),
            "REDIS_URL" => url.clone()?,
            "REDIS_SOCKET_TYPE" => "tcp".into(),
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

fn main() {
    let secs = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!("| {IN_FLIGHT} in flight, {KEYS} keys, {secs} s | requests/s | p50 µs | p99 µs |\n|---|---|---|---|");
        row("bare tonic RateLimitService", grpc_load(bare().await, secs).await);
        let rls = throttle_rls(None).await;
        row("throttle-rls, memory store", grpc_load(rls.grpc_addr, secs).await);
        row("direct API, memory store", direct(BoxStore::new(MemoryStore::new()), secs).await);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let Ok(mut redis) = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
        else {
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
        let rls = throttle_rls(Some(port)).await;
        let grpc = rls.grpc_addr;
        // Wait until the service's own Redis connection answers.
        while RateLimitServiceClient::connect(format!("http://{grpc}")).await.unwrap().should_rate_limit(request(0)).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        row("throttle-rls, Redis", grpc_load(grpc, secs).await);
        row("direct API, Redis", direct(BoxStore::new(store), secs).await);
        let _ = redis.kill();
        let _ = redis.wait();
    });
}
