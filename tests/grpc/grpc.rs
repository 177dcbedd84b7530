//! gRPC over real TCP: a tonic client against a tonic server (the standard
//! `grpc.health.v1.Health` service) behind `ThrottleLayer`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::HeaderName;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;
use tonic_types::StatusExt;
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{BearerToken, GrpcMethod, HeaderKey};
use tower_throttle::{key::Global, MemoryStore, Policy, Store, ThrottleLayer};

/// A store on a clock that stands still: a minute boundary mid-test would
/// open a new fixed window and admit the calls asserted limited.
fn frozen_store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

/// Serves the health service behind `layer` on a free loopback port.
async fn serve<St: Store>(layer: ThrottleLayer<St>) -> (SocketAddr, HealthReporter) {
    let (reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    (addr, reporter)
}

async fn connect(addr: SocketAddr, from: Option<IpAddr>) -> HealthClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .local_address(from)
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.into(),
    }
}

/// Asserts a limited call's status, and returns its retry delay.
fn assert_exhausted(status: &Status) -> Duration {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("Too many requests"),
        "{status:?}"
    );
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("RetryInfo with a delay");
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The metadata is the same delay in whole seconds, rounded up.
    assert_eq!(
        retry_after,
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
    );
    assert!(status.metadata().get("ratelimit").is_some());
    delay
}

/// Runs `call` until it succeeds, at most 5 s: for what only the server
/// sees happen (a response body dropped after the client went away).
async fn eventually<F, Fut>(mut call: F) -> Result<(), Status>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Status>>,
{
    let mut last = Ok(());
    for _ in 0..500 {
        last = call().await;
        if last.is_ok() {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    last
}

#[tokio::test]
async fn a_limited_unary_call_is_resource_exhausted_with_retry_info() {
    // The default key, PeerIp, reads tonic's TcpConnectInfo: no call is refused for want of it.
    let layer = ThrottleLayer::new(
        frozen_store(),
        Policy::fixed_window(2, Duration::from_secs(60)).unwrap(),
    );
    let (addr, _reporter) = serve(layer).await;
    let mut client = connect(addr, None).await;
    for _ in 0..2 {
        let reply = client.check(check("")).await.unwrap();
        assert_eq!(reply.into_inner().status, ServingStatus::Serving as i32);
    }
    let status = client.check(check("")).await.unwrap_err();
    let delay = assert_exhausted(&status);
    assert!(
        delay >= Duration::from_secs(1) && delay <= Duration::from_secs(60),
        "{delay:?}"
    );
}

#[tokio::test]
async fn peer_ip_keys_each_tonic_client_by_its_address() {
    let layer = ThrottleLayer::new(
        frozen_store(),
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    );
    let (addr, _reporter) = serve(layer).await;
    // The whole of 127.0.0.0/8 is loopback: two clients, two addresses.
    let mut one = connect(addr, Some("127.0.0.1".parse().unwrap())).await;
    let mut two = connect(addr, Some("127.0.0.2".parse().unwrap())).await;
    one.check(check("")).await.unwrap();
    assert_exhausted(&one.check(check("")).await.unwrap_err());
    two.check(check("")).await.unwrap();
    assert_exhausted(&two.check(check("")).await.unwrap_err());
}

#[tokio::test]
async fn metadata_and_method_keys() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let layer = ThrottleLayer::new(frozen_store(), policy).key((
        GrpcMethod::full(),
        HeaderKey::new(HeaderName::from_static("x-user-id")),
    ));
    let (addr, _reporter) = serve(layer).await;
    let mut client = connect(addr, None).await;
    let as_user = |user: &str| {
        let mut req = tonic::Request::new(check(""));
        req.metadata_mut()
            .insert("x-user-id", user.parse().unwrap());
        req
    };
    client.check(as_user("ada")).await.unwrap();
    assert_exhausted(&client.check(as_user("ada")).await.unwrap_err());
    client.check(as_user("bob")).await.unwrap();
    // No user: UNAUTHENTICATED, not a rate limit.
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let layer = ThrottleLayer::new(frozen_store(), policy).key(BearerToken);
    let (addr, _reporter) = serve(layer).await;
    let mut client = connect(addr, None).await;
    let with_token = |token: &str| {
        let mut req = tonic::Request::new(check(""));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        req
    };
    client.check(with_token("t1")).await.unwrap();
    assert_exhausted(&client.check(with_token("t1")).await.unwrap_err());
    client.check(with_token("t2")).await.unwrap();
}

/// One call at a time, whoever makes it.
fn one_at_a_time() -> ThrottleLayer<MemoryStore> {
    ThrottleLayer::new(MemoryStore::new(), Policy::concurrency(1).unwrap()).key(Global)
}

#[tokio::test]
async fn a_streaming_call_holds_its_permit_until_the_stream_ends() {
    let (addr, mut reporter) = serve(one_at_a_time()).await;
    reporter
        .set_service_status("demo", tonic_health::ServingStatus::Serving)
        .await;
    let mut client = connect(addr, None).await;
    // Unary calls take and return the permit.
    client.check(check("")).await.unwrap();
    client.check(check("")).await.unwrap();

    let mut watch = client.watch(check("demo")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    // The stream is open: the permit is taken.
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // Ending the service's status ends the stream with OK.
    reporter.clear_service_status("demo").await;
    assert!(watch.message().await.unwrap().is_none());
    eventually(|| {
        let mut c = client.clone();
        async move { c.check(check("")).await.map(drop) }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_cancelled_streaming_call_gives_its_permit_back() {
    let (addr, _reporter) = serve(one_at_a_time()).await;
    let mut client = connect(addr, None).await;
    let mut watch = client.watch(check("")).await.unwrap().into_inner();
    watch.message().await.unwrap().unwrap();
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    // Dropping the stream cancels the call (RST_STREAM): the server drops
    // the response body, and with it the permit.
    drop(watch);
    eventually(|| {
        let mut c = client.clone();
        async move { c.check(check("")).await.map(drop) }
    })
    .await
    .unwrap();
    // And only one at a time still.
    let mut watch = client.watch(check("")).await.unwrap().into_inner();
    watch.message().await.unwrap().unwrap();
    assert_eq!(
        client.check(check("")).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
}

#[tokio::test]
async fn one_layer_answers_http_and_grpc_each_in_its_own_protocol() {
    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let (_reporter, health) = tonic_health::server::health_reporter();
    let layer = ThrottleLayer::new(
        frozen_store(),
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    );
    let app = tonic::service::Routes::new(health)
        .into_axum_router()
        .route("/hello", get(|| async { "hello" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });

    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let uri: http::Uri = format!("http://{addr}/hello").parse().unwrap();
    let ok = http.get(uri.clone()).await.unwrap();
    assert_eq!(ok.status(), 200);
    let limited = http.get(uri).await.unwrap();
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().contains_key("retry-after"));
    assert!(limited.headers().get("grpc-status").is_none());
    let body = limited.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"Too many requests"));

    // The same client address, the same bucket: the gRPC call is limited, as gRPC.
    let mut client = connect(addr, None).await;
    assert_exhausted(&client.check(check("")).await.unwrap_err());
}
