//! The layer on a plain tower service served by hyper, without axum.
//!
//! `cargo run --example tower_service` starts a server on 127.0.0.1, port
//! `PORT` (default 3000), sends it five requests with hyper's client and
//! prints what came back: three admitted, then 429s with `Retry-After` and
//! the `RateLimit` fields. It then keeps serving, and prints a `curl` line
//! to try (Ctrl-C ends it).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tower::ServiceBuilder;
use tower_throttle::key::PeerIp;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

async fn hello(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::from_static(b"hello\n"))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limit = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(3, Duration::from_secs(10))?,
    )
    .key(PeerIp::new())
    .headers_on_allowed(true);

    // Build the throttled service once; connections share clones of it.
    let throttled = ServiceBuilder::new().layer(limit).service_fn(hello);

    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse()?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                continue;
            };
            // PeerIp reads the peer address from a `SocketAddr` extension.
            let service = ServiceBuilder::new()
                .map_request(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert::<SocketAddr>(peer);
                    req
                })
                .service(throttled.clone());
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
                if let Err(e) = conn.await {
                    eprintln!("connection error: {e}");
                }
            });
        }
    });

    println!("serving on http://{addr}");
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    for i in 1..=5 {
        let res = client.get(format!("http://{addr}/").parse()?).await?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await?.to_bytes();
        println!(
            "request {i}: {} retry-after={:?} ratelimit={:?} body={:?}",
            parts.status,
            parts.headers.get("retry-after"),
            parts.headers.get("ratelimit"),
            String::from_utf8_lossy(&body).trim_end(),
        );
    }
    println!("still serving (Ctrl-C to stop); the same limit holds for curl:");
    println!("  for i in 1 2 3 4; do curl -si http://{addr}/ | grep -i -e '^HTTP' -e '^ratelimit:'; done");
    server.await?;
    Ok(())
}
