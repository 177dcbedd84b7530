//! Warnings the layer promises to log once, not per request, read through a
//! subscriber installed for this test binary: a missing peer address (the
//! server was not set up to record it), forwarding headers reaching a
//! `ClientIp` that trusts no proxy, and an upgraded connection whose
//! handler did not claim its `UpgradePermit`. Each is logged at its level,
//! with the fix, exactly once however many requests hit it.

use crate::capture;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use capture::Capture;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tower::{Layer, ServiceExt};
use tower_throttle::key::ClientIp;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
use tracing::Level;

async fn ok(_: Request<()>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

#[tokio::test]
async fn misconfigurations_are_logged_once() {
    let capture = Capture::install();
    let minute = Duration::from_secs(60);

    // No peer address recorded (axum served without `ConnectInfo`): a 500
    // for each request, the fix logged once at error level.
    let svc = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(100, minute).unwrap(),
    )
    .layer(tower::service_fn(ok));
    for _ in 0..3 {
        let status = svc
            .clone()
            .oneshot(Request::new(()))
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(capture.count(Level::ERROR, "misconfigured"), 1);

    // Forwarding headers while no proxy is trusted: ignored (the TCP peer
    // is the key), and said once per extractor, whose clones share it.
    let svc = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(100, minute).unwrap(),
    )
    .key(ClientIp::new())
    .prefix("fwd")
    .layer(tower::service_fn(ok));
    for client in ["203.0.113.7", "203.0.113.8", "203.0.113.9"] {
        let mut req = Request::builder()
            .header("x-forwarded-for", client)
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert("192.0.2.1:4000".parse::<SocketAddr>().unwrap());
        let status = svc.clone().oneshot(req).await.unwrap().status();
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(capture.count(Level::WARN, "trusts no proxy"), 1);

    // Upgrades (101 Switching Protocols) whose handler left the permit
    // unclaimed: the permit covers the handshake only, said once.
    let svc = ThrottleLayer::new(MemoryStore::new(), Policy::concurrency(10).unwrap())
        .key(tower_throttle::key::Global)
        .prefix("ws")
        .layer(tower::service_fn(|_: Request<()>| async {
            let mut response = Response::new(Empty::<Bytes>::new());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            Ok::<_, Infallible>(response)
        }));
    for _ in 0..3 {
        let req = Request::builder()
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(())
            .unwrap();
        let status = svc.clone().oneshot(req).await.unwrap().status();
        assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
    }
    assert_eq!(capture.count(Level::WARN, "were not claimed"), 1);
}
