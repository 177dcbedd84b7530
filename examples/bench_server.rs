//! The server behind `scripts/http_load.sh`: one axum app, bare or behind
//! ThrottleLayer or tower_governor, keyed by the `x-user` header.
//!
//! `cargo run --release --example bench_server -- <bare|throttle|governor> <allowed|denied> <port>`
//! Listens on 127.0.0.1 only; runs until killed (the script bounds it).

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[path = "../benches/common/user_header.rs"]
mod user_header;
use user_header::{UserHeader, USER};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [which, path, port] = &args[..] else {
        eprintln!("usage: bench_server <bare|throttle|governor> <allowed|denied> <port>");
        std::process::exit(2);
    };
    // Allowed: a quota no user exhausts. Denied: one request per user an hour.
    let (burst, period) = match path.as_str() {
        "denied" => (1u32, Duration::from_secs(3600)),
        _ => (1_000_000, Duration::from_secs(1)),
    };
    let app = Router::new().route("/", get(|| async { "ok" }));
    let app = match which.as_str() {
        "bare" => app,
        "throttle" => app.layer(
            ThrottleLayer::new(
                MemoryStore::new(),
                Policy::cell(u64::from(burst) - 1, 1, period).expect("valid policy"),
            )
            .key(HeaderKey::new(USER)),
        ),
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .key_extractor(UserHeader)
                .period(period)
                .burst_size(burst)
                .finish()
                .expect("valid quota");
            app.layer(GovernorLayer::new(config))
        }
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("a port number");
    // One worker: the other core drives the load.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        axum::serve(listener, app).await.expect("serve");
    });
}
