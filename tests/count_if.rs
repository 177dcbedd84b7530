//! `count_if`'s promises beyond the status a response carries: a request
//! abandoned before its response keeps its charge (hanging up does not
//! dodge the count), and an inner service error counts as a 500.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::key::Global;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

fn minute(n: u64) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

/// 401 at once, or never an answer for a request asking to `hang`.
async fn login(req: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() == "/hang" {
        std::future::pending::<()>().await;
    }
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = StatusCode::UNAUTHORIZED;
    Ok(response)
}

fn get(path: &str) -> Request<()> {
    Request::builder().uri(path).body(()).unwrap()
}

/// Two failed logins a minute. A client that hangs up before its answer
/// used one of them: after one more failure, the next attempt is refused.
/// Were the abandoned attempt refunded, that one would pass.
#[tokio::test]
async fn an_abandoned_request_keeps_its_charge() {
    let svc = ThrottleLayer::new(MemoryStore::new(), minute(2))
        .key(Global)
        .count_if(|s| s == StatusCode::UNAUTHORIZED)
        .layer(tower::service_fn(login));
    let hanging = tokio::spawn(svc.clone().oneshot(get("/hang")));
    // Let it reach the inner service, then hang up.
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    hanging.abort();
    assert!(hanging.await.unwrap_err().is_cancelled());
    let failed = svc.clone().oneshot(get("/login")).await.unwrap();
    assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    let next = svc.clone().oneshot(get("/login")).await.unwrap();
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[derive(Debug)]
struct Broken;

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("broken")
    }
}

impl std::error::Error for Broken {}

/// Counting server errors only, one a minute: an inner service that fails
/// (no response at all) counts as a 500, so the next request is refused.
/// A request answered 200 in between is refunded and leaves no trace.
#[tokio::test]
async fn an_inner_service_error_counts_as_a_server_error() {
    let svc = ThrottleLayer::new(MemoryStore::new(), minute(1))
        .key(Global)
        .count_if(|s| s.is_server_error())
        .layer(tower::service_fn(|req: Request<()>| async move {
            if req.uri().path() == "/fail" {
                return Err(Broken);
            }
            Ok(Response::new(Full::new(Bytes::new())))
        }));
    let ok = svc.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK, "a 200 is refunded");
    assert!(svc.clone().oneshot(get("/fail")).await.is_err());
    let next = svc.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
}
