//! A `PeerIp` layer on an axum server served without connect info (plain
//! `axum::serve(listener, app)`): every request is a 500 whose body says
//! what is wrong in the server's terms and leaks no internals; the fix is
//! in the log (`tests/logged_once`).

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_throttle::key::{KeyExtractor, KeyWriter, MissingKey, PeerIp, RequestHead};
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

use crate::served::{get as request, serve};

const EXPLAINED: &str = "Internal server error: rate limiting is misconfigured \
    (the server does not pass the client's network address to its rate limiter); \
    the server's log says how to fix it.";

#[tokio::test]
async fn a_missing_peer_address_is_explained_without_internals() {
    let policy = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    for problem_json in [false, true] {
        let layer = ThrottleLayer::new(MemoryStore::new(), policy)
            .key(PeerIp::new())
            .prefix("secretpfx");
        let layer = if problem_json {
            layer.problem_json_body()
        } else {
            layer
        };
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let addr = serve(app, false).await;
        for _ in 0..2 {
            let (status, _, body) = request(addr, "/", &[]).await;
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(body.contains(EXPLAINED), "{body}");
            for internal in [
                "secretpfx",
                "ConnectInfo",
                "SocketAddr",
                "into_make_service",
                "PeerIp",
                "default",
            ] {
                assert!(!body.contains(internal), "leaks {internal:?}: {body}");
            }
        }
        // The same app served with connect info is limited per client.
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(ThrottleLayer::new(MemoryStore::new(), policy).key(PeerIp::new()));
        let (status, _, body) = request(serve(app, true).await, "/", &[]).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    }
}

/// A key of the server's own making that is never there.
#[derive(Clone)]
struct Tenant(Option<&'static str>);

impl KeyExtractor for Tenant {
    fn extract(&self, _: &RequestHead<'_>, _: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let missing = MissingKey::misconfigured("install the tenant layer before this one");
        Err(match self.0 {
            Some(words) => missing.explained(words),
            None => missing,
        })
    }
}

#[tokio::test]
async fn a_custom_misconfiguration_says_its_own_words_or_generic_ones() {
    let policy = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    for (key, said) in [
        (Tenant(Some("no tenant is known")), "(no tenant is known)"),
        (
            Tenant(None),
            "(the server cannot build this request's rate-limit key)",
        ),
    ] {
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(ThrottleLayer::new(MemoryStore::new(), policy).key(key));
        let (status, _, body) = request(serve(app, true).await, "/", &[]).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains(said), "{body}");
        assert!(
            !body.contains("tenant layer"),
            "the fix stays in the log: {body}"
        );
    }
}
