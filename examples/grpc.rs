//! A tonic server exposing the standard `grpc.health.v1.Health` service
//! behind `ThrottleLayer`: 3 calls a minute per client address.
//!
//! ```sh
//! cargo run --example grpc --features grpc            # PORT=50051 by default
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check   # 4 times
//! ```
//!
//! The 4th call within a minute ends with `RESOURCE_EXHAUSTED` (8), a
//! `google.rpc.RetryInfo` detail carrying the delay, and `retry-after`
//! metadata. Any gRPC client sees the same; with Python's grpcio:
//!
//! ```python
//! import grpc
//! from grpc_health.v1 import health_pb2, health_pb2_grpc
//! from grpc_status import rpc_status
//! from google.rpc import error_details_pb2
//!
//! stub = health_pb2_grpc.HealthStub(grpc.insecure_channel("127.0.0.1:50051"))
//! for _ in range(4):
//!     try:
//!         print(stub.Check(health_pb2.HealthCheckRequest()).status)
//!     except grpc.RpcError as e:
//!         info = error_details_pb2.RetryInfo()
//!         rpc_status.from_call(e).details[0].Unpack(info)
//!         print(e.code(), e.details(), info.retry_delay.ToTimedelta())
//! ```

use std::time::Duration;

use tonic::transport::Server;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse()?,
        Err(_) => 50051,
    };
    let (_reporter, health) = tonic_health::server::health_reporter();
    // The default key is the client address (tonic's `TcpConnectInfo`), and
    // gRPC requests are answered with gRPC statuses by default.
    let layer = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::sliding_log(3, Duration::from_secs(60))?,
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    println!("listening on {addr}");
    println!(
        "try: grpcurl -plaintext {addr} grpc.health.v1.Health/Check  (4 times within a minute)"
    );
    Server::builder()
        .layer(layer)
        .add_service(health)
        .serve(addr)
        .await?;
    Ok(())
}
