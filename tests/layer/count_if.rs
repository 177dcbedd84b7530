//! `count_if`'s promises beyond the status a response carries: a request
//! abandoned before its response keeps its charge (hanging up does not
//! dodge the count), and an inner service error counts as a 500. And in
//! front of gRPC, where every call is HTTP 200: the predicate sees the
//! call's `grpc-status`, from a Trailers-Only response's headers or from
//! the trailers that end a streamed body (a tonic client against a tonic
//! server over TCP); an outcome never known (a body dropped before its
//! trailers, a missing or malformed `grpc-status`) counts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::grpc::GrpcCode;
use tower_throttle::key::Global;
use tower_throttle::outcome::Outcome;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

fn minute(n: u64) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

/// A store on a clock that stands still: a minute boundary mid-test would
/// open a new window and change every count below.
fn store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
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
    let svc = ThrottleLayer::new(store(), minute(2))
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
    let svc = ThrottleLayer::new(store(), minute(1))
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

#[tokio::test]
async fn count_if_outcome_sees_an_http_response_s_status() {
    let svc = ThrottleLayer::new(store(), minute(2))
        .key(Global)
        .count_if_outcome(|o| o == Outcome::Http(StatusCode::UNAUTHORIZED))
        .layer(tower::service_fn(login));
    for _ in 0..2 {
        let failed = svc.clone().oneshot(get("/login")).await.unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    }
    let next = svc.clone().oneshot(get("/login")).await.unwrap();
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
}

// gRPC over real TCP: a tonic client against a tonic server.

/// Logins on the health API; the password is the `service` field. `check`
/// answers `right` with OK (headers, a message, `grpc-status: 0` in the
/// trailers) and anything else with UNAUTHENTICATED at once (Trailers-Only).
/// `watch` streams two messages, then ends OK for `right`, or with
/// UNAUTHENTICATED in its trailers for anything else.
struct Login;

type Messages = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, tonic::Status>> + Send>>;

fn serving() -> Result<HealthCheckResponse, tonic::Status> {
    Ok(HealthCheckResponse { status: 1 })
}

fn wrong_password() -> tonic::Status {
    tonic::Status::unauthenticated("wrong password")
}

#[tonic::async_trait]
impl Health for Login {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        match request.get_ref().service.as_str() {
            "right" => serving().map(tonic::Response::new),
            _ => Err(wrong_password()),
        }
    }

    type WatchStream = Messages;

    async fn watch(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Messages>, tonic::Status> {
        let end = (request.get_ref().service != "right").then(|| Err(wrong_password()));
        let messages = stream::iter([serving(), serving()].into_iter().chain(end));
        Ok(tonic::Response::new(Box::pin(messages)))
    }
}

/// Serves `Login` behind `layer` on a free loopback port, and connects.
async fn login_server(layer: ThrottleLayer<MemoryStore<ManualClock>>) -> HealthClient<Channel> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(HealthServer::new(Login))
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn password(password: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: password.into(),
    }
}

/// A unary login's outcome.
async fn unary(client: &mut HealthClient<Channel>, pw: &str) -> Code {
    match client.check(password(pw)).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// A streamed login's outcome: every message read, then the trailers' status.
async fn streamed(client: &mut HealthClient<Channel>, pw: &str) -> Code {
    let mut messages = match client.watch(password(pw)).await {
        Ok(response) => response.into_inner(),
        Err(status) => return status.code(),
    };
    let mut read = 0;
    loop {
        match messages.message().await {
            Ok(Some(_)) => read += 1,
            Ok(None) => break Code::Ok,
            Err(status) => {
                assert_eq!(read, 2, "the status came after the messages");
                break status.code();
            }
        }
    }
}

/// Five failed logins a minute, for everyone.
fn five_failed_logins() -> ThrottleLayer<MemoryStore<ManualClock>> {
    ThrottleLayer::new(store(), minute(5)).key(Global)
}

fn unauthenticated(o: Outcome) -> bool {
    o == Outcome::Grpc(GrpcCode::UNAUTHENTICATED)
}

#[tokio::test]
async fn failed_unary_grpc_logins_count_and_the_sixth_is_resource_exhausted() {
    let mut client = login_server(five_failed_logins().count_if_outcome(unauthenticated)).await;
    // Successful calls (status in the trailers) leave no trace: more than
    // the limit pass, between failures (Trailers-Only) that count.
    let mut seen = Vec::new();
    for pw in ["right", "a", "right", "right", "b", "c", "right", "right"] {
        seen.push(unary(&mut client, pw).await);
    }
    for pw in ["d", "e", "f", "right"] {
        seen.push(unary(&mut client, pw).await);
    }
    use Code::{Ok as OK, ResourceExhausted as Limited, Unauthenticated as Failed};
    assert_eq!(
        seen,
        [OK, Failed, OK, OK, Failed, Failed, OK, OK, Failed, Failed, Limited, Limited]
    );
}

#[tokio::test]
async fn streams_failing_in_their_trailers_count_and_the_sixth_is_resource_exhausted() {
    let mut client = login_server(five_failed_logins().count_if_outcome(unauthenticated)).await;
    for _ in 0..7 {
        assert_eq!(streamed(&mut client, "right").await, Code::Ok);
    }
    for _ in 0..5 {
        assert_eq!(streamed(&mut client, "wrong").await, Code::Unauthenticated);
    }
    assert_eq!(
        streamed(&mut client, "wrong").await,
        Code::ResourceExhausted
    );
    assert_eq!(
        streamed(&mut client, "right").await,
        Code::ResourceExhausted
    );
    assert_eq!(unary(&mut client, "right").await, Code::ResourceExhausted);
}

/// The case reported: `count_if` on HTTP statuses in front of gRPC admitted
/// 31 of 31 UNAUTHENTICATED calls with a limit of 5 (all were HTTP 200). It
/// sees a gRPC status's HTTP equivalent: UNAUTHENTICATED is a 401.
#[tokio::test]
async fn count_if_on_http_statuses_counts_grpc_failures_by_their_http_equivalent() {
    let layer = five_failed_logins().count_if(|s| s == StatusCode::UNAUTHORIZED);
    let mut client = login_server(layer).await;
    for _ in 0..6 {
        assert_eq!(unary(&mut client, "right").await, Code::Ok);
        assert_eq!(streamed(&mut client, "right").await, Code::Ok);
    }
    let mut seen = Vec::new();
    for i in 0..31 {
        let code = if i % 2 == 0 {
            unary(&mut client, "wrong").await
        } else {
            streamed(&mut client, "wrong").await
        };
        seen.push(code);
    }
    let failed = seen.iter().filter(|&&c| c == Code::Unauthenticated).count();
    let limited = seen
        .iter()
        .filter(|&&c| c == Code::ResourceExhausted)
        .count();
    assert_eq!((failed, limited), (5, 26), "{seen:?}");
    assert!(seen[..5].iter().all(|&c| c == Code::Unauthenticated));
}

// What is never known counts: in process, with bodies made by hand.

type GrpcBody = BoxBody<Bytes, Infallible>;

fn grpc_response(
    headers: &[(&'static str, &'static str)],
    frames: impl Stream<Item = Frame<Bytes>> + Send + Sync + 'static,
) -> Response<GrpcBody> {
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames.map(Ok))));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    for (name, value) in headers {
        response
            .headers_mut()
            .insert(*name, HeaderValue::from_static(value));
    }
    response
}

fn trailers(status: &'static str) -> Frame<Bytes> {
    let mut map = HeaderMap::new();
    map.insert("grpc-status", HeaderValue::from_static(status));
    Frame::trailers(map)
}

fn message() -> Frame<Bytes> {
    Frame::data(Bytes::from_static(b"\0\0\0\0\0"))
}

/// gRPC responses by path: `/ok` ends with `grpc-status: 0` in its
/// trailers, `/hang` never ends after its first message, `/no-trailers`
/// ends without trailers, `/bad-trailers` with a malformed status in them,
/// `/bad-head` is Trailers-Only with a malformed status.
async fn grpc(req: Request<()>) -> Result<Response<GrpcBody>, Infallible> {
    let frames = |f: Vec<Frame<Bytes>>| stream::iter(f);
    Ok(match req.uri().path() {
        "/ok" => grpc_response(&[], frames(vec![message(), trailers("0")])),
        "/hang" => grpc_response(&[], frames(vec![message()]).chain(stream::pending())),
        "/no-trailers" => grpc_response(&[], frames(vec![message()])),
        "/bad-trailers" => grpc_response(&[], frames(vec![message(), trailers("1.5")])),
        "/bad-head" => grpc_response(&[("grpc-status", "sixteen")], frames(vec![])),
        _ => unreachable!(),
    })
}

/// One failed login a minute; only UNAUTHENTICATED counts.
fn one_failure() -> ThrottleLayer<MemoryStore<ManualClock>> {
    ThrottleLayer::new(store(), minute(1))
        .key(Global)
        .count_if_outcome(unauthenticated)
}

/// Reads `response`'s body to its end.
async fn read_to_end(response: Response<impl http_body::Body<Error = Infallible>>) {
    let _ = response.into_body().collect().await.unwrap();
}

#[tokio::test]
async fn a_grpc_body_dropped_before_its_trailers_keeps_its_charge() {
    let svc = one_failure().layer(tower::service_fn(grpc));
    // Read to their trailers, OK calls are refunded.
    for _ in 0..3 {
        let ok = svc.clone().oneshot(get("/ok")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        read_to_end(ok).await;
    }
    // A call whose client hangs up after its first message: never known.
    let hang = svc.clone().oneshot(get("/hang")).await.unwrap();
    let mut body = hang.into_body();
    assert!(body.frame().await.unwrap().unwrap().is_data());
    drop(body);
    let next = svc.clone().oneshot(get("/ok")).await.unwrap();
    assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_missing_or_malformed_grpc_status_counts() {
    for path in ["/no-trailers", "/bad-trailers", "/bad-head"] {
        let svc = one_failure().layer(tower::service_fn(grpc));
        let first = svc.clone().oneshot(get(path)).await.unwrap();
        assert_eq!(first.status(), StatusCode::OK, "{path}");
        read_to_end(first).await;
        let next = svc.clone().oneshot(get("/ok")).await.unwrap();
        assert_eq!(next.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
}
