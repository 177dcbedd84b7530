//! A unary gRPC call (`grpc.health.v1.Health/Check`) over loopback TCP: bare
//! tonic, tonic behind ThrottleLayer admitting every call (memory store, the
//! default `PeerIp` key), and behind a layer denying every call (the
//! Trailers-Only `RESOURCE_EXHAUSTED` with RetryInfo), side by side. Each
//! iteration is 64 calls in flight at once on one HTTP/2 connection, so
//! the figure is requests per second. `cargo bench --bench grpc --features grpc`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower_throttle::key::Global;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

const IN_FLIGHT: u64 = 64;

/// Calls made, and denied calls that ended otherwise than `RESOURCE_EXHAUSTED`.
static CALLS: AtomicU64 = AtomicU64::new(0);
static OTHER: AtomicU64 = AtomicU64::new(0);

async fn listener() -> (TcpIncoming, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Without TCP_NODELAY, small responses wait for delayed ACKs (40 ms).
    (TcpIncoming::from(listener).with_nodelay(Some(true)), addr)
}

async fn bare() -> SocketAddr {
    let (incoming, addr) = listener().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    addr
}

async fn throttled(layer: ThrottleLayer<MemoryStore>) -> SocketAddr {
    let (incoming, addr) = listener().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            // A denied call is answered before its request body is read; the
            // client's DATA then races the answer, and after ~10k denials on
            // one connection h2's reset-flood guards (pending-accept resets,
            // then local error resets) close it. This bench denies ~100k
            // calls on one connection: lift both guards.
            .http2_max_pending_accept_reset_streams(Some(usize::MAX))
            .http2_max_local_error_reset_streams(Some(usize::MAX))
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    addr
}

async fn connect(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// Sends `batches` × [`IN_FLIGHT`] calls, each batch at once; every call
/// must end with `expect`.
async fn run(client: &HealthClient<Channel>, batches: u64, expect: Code) -> Duration {
    let start = Instant::now();
    for _ in 0..batches {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..IN_FLIGHT {
            let mut c = client.clone();
            calls.spawn(async move {
                let (code, detail) = match c.check(HealthCheckRequest::default()).await {
                    Ok(_) => (Code::Ok, String::new()),
                    Err(status) => (status.code(), format!("{status:?}")),
                };
                // On the denied path h2's reset guards may still close the
                // connection now and then (see `throttled`): counted, reported.
                if code != expect {
                    assert_eq!(expect, Code::ResourceExhausted, "{detail}");
                    OTHER.fetch_add(1, Ordering::Relaxed);
                }
                CALLS.fetch_add(1, Ordering::Relaxed);
            });
        }
        while let Some(done) = calls.join_next().await {
            done.unwrap();
        }
    }
    start.elapsed()
}

fn unary(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let admit_all = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::token_bucket(1_000_000, 1_000_000.0).unwrap(),
    );
    let deny_all = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(1, Duration::from_secs(3600)).unwrap(),
    )
    .key(Global);
    let (bare, admit, deny) = rt.block_on(async {
        let bare = connect(bare().await).await;
        let admit = connect(throttled(admit_all).await).await;
        let deny = connect(throttled(deny_all).await).await;
        // Spend the denying layer's one call.
        deny.clone()
            .check(HealthCheckRequest::default())
            .await
            .unwrap();
        (bare, admit, deny)
    });

    let mut group = c.benchmark_group("grpc_unary");
    group.throughput(Throughput::Elements(IN_FLIGHT));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("bare_tonic", |b| {
        b.iter_custom(|n| rt.block_on(run(&bare, n, Code::Ok)))
    });
    group.bench_function("throttle_allowed", |b| {
        b.iter_custom(|n| rt.block_on(run(&admit, n, Code::Ok)))
    });
    CALLS.store(0, Ordering::Relaxed);
    group.bench_function("throttle_denied", |b| {
        b.iter_custom(|n| rt.block_on(run(&deny, n, Code::ResourceExhausted)))
    });
    group.finish();
    println!(
        "denied path: {} of {} calls ended with a transport error, not RESOURCE_EXHAUSTED",
        OTHER.load(Ordering::Relaxed),
        CALLS.load(Ordering::Relaxed)
    );
}

criterion_group!(benches, unary);
criterion_main!(benches);
