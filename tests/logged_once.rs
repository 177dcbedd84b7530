//! Warnings the layer promises to log once, not per request, read through a
//! subscriber installed for this test binary: a missing peer address (the
//! server was not set up to record it), forwarding headers reaching a
//! `ClientIp` that trusts no proxy, and an upgraded connection whose
//! handler did not claim its `UpgradePermit`. Each is logged at its level,
//! with the fix, exactly once however many requests hit it.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tower::{Layer, ServiceExt};
use tower_throttle::key::ClientIp;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every event: its level, target, and fields as `name=value` pairs.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Level, String, String)>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let meta = event.metadata();
        let entry = (*meta.level(), meta.target().to_owned(), fields.0);
        self.0.lock().unwrap().push(entry);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Capture {
    /// The events at `level` whose fields contain `needle`.
    fn count(&self, level: Level, needle: &str) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, target, text)| {
                *l == level && target == "tower_throttle" && text.contains(needle)
            })
            .count()
    }
}

async fn ok(_: Request<()>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

#[tokio::test]
async fn misconfigurations_are_logged_once() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(capture.clone()).unwrap();
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
