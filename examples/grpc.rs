//! A tonic server exposing the standard `grpc.health.v1.Health` service
//! behind `ThrottleLayer`: 3 calls a minute per client address.
//!
//! ```sh
//! cargo run --example grpc --features grpc                # PORT=50051 by default
//! cargo run --example grpc --features grpc -- client 4    # another terminal: 4 calls
//! ```
//!
//! The 4th call within a minute ends with `RESOURCE_EXHAUSTED` (8), a
//! `google.rpc.RetryInfo` detail carrying the delay, and `retry-after`
//! metadata. Any gRPC client sees the same; the server prints a Python one
//! too (`pip install grpcio grpcio-health-checking grpcio-status`).

use std::time::Duration;

use tonic::transport::{Endpoint, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

/// The Python client the server prints: grpcio, reading the same details.
const PYTHON: &str = r#"import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from google.rpc import error_details_pb2

stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("ADDR"))
for _ in range(4):
    try:
        print(health_pb2.HealthCheckResponse.ServingStatus.Name(stub.Check(health_pb2.HealthCheckRequest()).status))
    except grpc.RpcError as e:
        info = error_details_pb2.RetryInfo()
        rpc_status.from_call(e).details[0].Unpack(info)
        print(e.code(), e.details(), "retry in", info.retry_delay.ToTimedelta())"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse()?,
        Err(_) => 50051,
    };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, calls @ ..] = &args[..] {
        if mode == "client" {
            let calls = calls.first().map_or(Ok(4), |n| n.parse())?;
            return client(addr, calls).await;
        }
    }
    let (_reporter, health) = tonic_health::server::health_reporter();
    // The default key is the client address (tonic's `TcpConnectInfo`), and
    // gRPC requests are answered with gRPC statuses by default.
    let layer = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::sliding_log(3, Duration::from_secs(60))?,
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!(
        "listening on {addr}; the 4th call within a minute is refused. Try, from another terminal:"
    );
    println!(
        "  PORT={} cargo run --example grpc --features grpc -- client 4",
        addr.port()
    );
    println!("or with Python's grpcio:");
    println!("  pip install grpcio grpcio-health-checking grpcio-status");
    println!(
        "  python3 - <<'EOF'\n{}\nEOF",
        PYTHON.replace("ADDR", &addr.to_string())
    );
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// `calls` health checks, each printed with the status or the refusal and
/// its `RetryInfo` delay.
async fn client(addr: std::net::SocketAddr, calls: u32) -> Result<(), Box<dyn std::error::Error>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut health = HealthClient::new(channel);
    for i in 1..=calls {
        match health.check(HealthCheckRequest::default()).await {
            Ok(reply) => println!("call {i}: {:?}", reply.into_inner().status()),
            Err(status) => {
                let delay = status.get_details_retry_info().and_then(|r| r.retry_delay);
                println!(
                    "call {i}: {:?} {:?}, retry in {delay:?}",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
