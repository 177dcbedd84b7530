//! The layer over real TCP: an axum server on 127.0.0.1:0, hyper's client.

use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::{Extension, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{ClientIp, FromExtension, KeyExtractor, PeerIp};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::store::Charge;
use tower_throttle::{
    Decision, MemoryStore, Policy, RateLimitInfo, Rule, Store, StoreError, ThrottleLayer,
};

#[derive(Clone, Debug)]
struct UserId(String);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Stands in for an auth layer: `x-user` becomes a `UserId` extension.
async fn auth(mut req: Request, next: Next) -> Response {
    if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        let user = UserId(user.to_owned());
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

async fn remaining(info: Option<Extension<RateLimitInfo>>) -> String {
    match info {
        Some(Extension(info)) if !info.is_limited() => format!("{:?}", info.not_limited()),
        Some(Extension(info)) if info.allowed() => {
            format!("ok {}", info.decision().unwrap().remaining)
        }
        Some(Extension(_)) => "would be limited".to_owned(),
        None => "unchecked".to_owned(),
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

struct Http {
    client: Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
}

impl Http {
    fn new(addr: SocketAddr) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            addr,
        }
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        let res = self
            .client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8(body.to_vec()).unwrap(),
        }
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("POST", path, headers).await
    }
}

fn manual_store() -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    (MemoryStore::builder().clock(clock.clone()).build(), clock)
}

fn reply_layer(store: MemoryStore<ManualClock>) -> ThrottleLayer<MemoryStore<ManualClock>> {
    ThrottleLayer::new(
        store,
        Policy::sliding_log(5, Duration::from_secs(60)).unwrap(),
    )
    .key(FromExtension::<UserId>::new())
    .prefix("reply")
    .request_info(true)
    .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
}

fn ugc_app(store: MemoryStore<ManualClock>) -> Router {
    let like = ThrottleLayer::new(store.clone(), Policy::token_bucket(3, 1.0).unwrap())
        .key(FromExtension::<UserId>::new())
        .prefix("like")
        .request_info(true);
    Router::new()
        .route(
            "/reply",
            post(remaining).route_layer(reply_layer(store.clone()).legacy_headers(true)),
        )
        .route("/like", post(remaining).route_layer(like))
        .layer(middleware::from_fn(auth))
}

#[tokio::test]
async fn sixth_reply_in_a_minute_is_429_with_headers() {
    let (store, clock) = manual_store();
    let http = Http::new(serve(ugc_app(store)).await);
    let alice = [("x-user", "alice")];
    for left in (0..5).rev() {
        let r = http.post("/reply", &alice).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, format!("ok {left}"));
        assert!(
            r.headers.get("ratelimit").is_none(),
            "headers only on 429 by default"
        );
    }
    clock.advance(Duration::from_millis(200));
    let r = http.post("/reply", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // The oldest of the five leaves 59.8 s from now: rounded up.
    assert_eq!(r.headers["retry-after"], "60");
    assert_eq!(r.headers["ratelimit-policy"], "\"default\";q=5;w=60");
    assert_eq!(r.headers["ratelimit"], "\"default\";r=0;t=60");
    assert_eq!(r.headers["x-ratelimit-limit"], "5");
    assert_eq!(r.headers["x-ratelimit-remaining"], "0");
    assert_eq!(r.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(r.body, "Too many requests: try again in 60 s.\n");

    // Denied requests consume nothing: once the five have left the window,
    // five fit again, and a sixth does not.
    clock.advance(Duration::from_millis(59_800));
    for _ in 0..5 {
        assert_eq!(http.post("/reply", &alice).await.status, StatusCode::OK);
    }
    assert_eq!(
        http.post("/reply", &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn users_and_routes_are_isolated() {
    let (store, _clock) = manual_store();
    let http = Http::new(serve(ugc_app(store)).await);
    for _ in 0..5 {
        assert_eq!(
            http.post("/reply", &[("x-user", "alice")]).await.status,
            200
        );
    }
    assert_eq!(
        http.post("/reply", &[("x-user", "alice")]).await.status,
        429
    );
    // Another user on the same route: a fresh quota.
    assert_eq!(http.post("/reply", &[("x-user", "bob")]).await.body, "ok 4");
    // The same user on another route: that route's own quota.
    assert_eq!(
        http.post("/like", &[("x-user", "alice")]).await.body,
        "ok 2"
    );
}

#[tokio::test]
async fn spoofed_forwarded_for_is_ignored() {
    let (store, _clock) = manual_store();
    let policy = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    // Behind a proxy on loopback: the rightmost untrusted hop is the client.
    let proxied = ThrottleLayer::new(store.clone(), policy)
        .key(ClientIp::new().trust("127.0.0.0/8".parse().unwrap()))
        .prefix("proxied")
        .request_info(true);
    // No trusted proxy: the header is never read.
    let direct = ThrottleLayer::new(store, policy)
        .key(ClientIp::new())
        .prefix("direct")
        .request_info(true);
    let app = Router::new()
        .route("/proxied", get(remaining).route_layer(proxied))
        .route("/direct", get(remaining).route_layer(direct));
    let http = Http::new(serve(app).await);
    for i in 0..3 {
        let xff = format!("6.6.6.{i}, 203.0.113.7");
        let r = http
            .send("GET", "/proxied", &[("x-forwarded-for", &xff)])
            .await;
        assert_eq!(r.status, 200, "request {i}");
    }
    let r = http
        .send(
            "GET",
            "/proxied",
            &[("x-forwarded-for", "1.2.3.4, 203.0.113.7")],
        )
        .await;
    assert_eq!(
        r.status, 429,
        "a new spoofed entry does not buy a new quota"
    );
    let r = http
        .send("GET", "/proxied", &[("x-forwarded-for", "203.0.113.8")])
        .await;
    assert_eq!(r.status, 200, "another real client has its own quota");

    for i in 0..3 {
        let xff = format!("198.51.100.{i}");
        let r = http
            .send("GET", "/direct", &[("x-forwarded-for", &xff)])
            .await;
        assert_eq!(r.status, 200);
    }
    let r = http
        .send("GET", "/direct", &[("x-forwarded-for", "9.9.9.9")])
        .await;
    assert_eq!(r.status, 429);
}

#[tokio::test]
async fn missing_identity_is_handled_as_configured() {
    let (store, _clock) = manual_store();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let reject = reply_layer(store.clone()).problem_json_body();
    let skip = ThrottleLayer::new(store.clone(), policy)
        .key(FromExtension::<UserId>::new())
        .prefix("skip")
        .request_info(true)
        .on_missing_key(OnMissingKey::Skip);
    let fallback = ThrottleLayer::new(store, policy)
        .key(FromExtension::<UserId>::new().or(PeerIp::new()))
        .prefix("fallback")
        .request_info(true);
    let app = Router::new()
        .route("/reject", post(remaining).route_layer(reject))
        .route("/skip", post(remaining).route_layer(skip))
        .route("/fallback", post(remaining).route_layer(fallback))
        .layer(middleware::from_fn(auth));
    let http = Http::new(serve(app).await);

    let r = http.post("/reject", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert!(r.body.contains("\"status\":401"), "{}", r.body);
    assert!(r.body.contains("no authenticated identity"), "{}", r.body);

    for _ in 0..3 {
        let r = http.post("/skip", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "Some(NoKey)"));
    }

    assert_eq!(http.post("/fallback", &[]).await.status, 200);
    assert_eq!(
        http.post("/fallback", &[]).await.status,
        429,
        "anonymous: per address"
    );
    assert_eq!(
        http.post("/fallback", &[("x-user", "carol")]).await.status,
        200
    );
}

#[tokio::test]
async fn several_rules_are_all_or_nothing() {
    let (store, clock) = manual_store();
    let layer = ThrottleLayer::new(
        store,
        Policy::sliding_log(2, Duration::from_secs(60)).unwrap(),
    )
    .name("minute")
    .and(Rule::new(
        "day",
        Policy::fixed_window(3, Duration::from_secs(86_400)).unwrap(),
    ))
    .key(FromExtension::<UserId>::new())
    .prefix("reply")
    .request_info(true)
    .headers_on_allowed(true);
    let app = Router::new()
        .route("/reply", post(remaining).route_layer(layer))
        .layer(middleware::from_fn(auth));
    let http = Http::new(serve(app).await);
    let u = [("x-user", "dave")];
    let r = http.post("/reply", &u).await;
    assert_eq!(
        r.headers["ratelimit-policy"],
        "\"minute\";q=2;w=60, \"day\";q=3;w=86400"
    );
    assert_eq!(r.body, "ok 1");
    assert_eq!(http.post("/reply", &u).await.status, 200);
    // The minute rule denies: the day rule is not charged.
    let r = http.post("/reply", &u).await;
    assert_eq!(r.status, 429);
    assert!(r.headers["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"minute\";r=0;t=60, \"day\";r=1;"));
    clock.advance(Duration::from_secs(61));
    assert_eq!(http.post("/reply", &u).await.status, 200);
    // Now the day rule denies, with the longer wait.
    clock.advance(Duration::from_secs(61));
    let r = http.post("/reply", &u).await;
    assert_eq!(r.status, 429);
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry > 3600, "the day window's wait, got {retry}");
}

#[tokio::test]
async fn delay_mode_admits_after_waiting() {
    // The layer sleeps on tokio's clock, in real time; the store decides on
    // a clock that stands still, so each wait is exactly the 300 ms slot
    // however long the requests take (on the system clock, a request
    // stalled past the slot was admitted at once, or not refused).
    let (store, _clock) = manual_store();
    let one_per_300ms = Policy::cell(0, 1, Duration::from_millis(300)).unwrap();
    let patient = ThrottleLayer::new(store.clone(), one_per_300ms)
        .key(tower_throttle::key::Global)
        .prefix("patient")
        .request_info(true)
        .delay_up_to(Duration::from_secs(2));
    let hasty = ThrottleLayer::new(store, one_per_300ms)
        .key(tower_throttle::key::Global)
        .prefix("hasty")
        .request_info(true)
        .delay_up_to(Duration::from_millis(50));
    let app = Router::new()
        .route("/patient", get(remaining).route_layer(patient))
        .route("/hasty", get(remaining).route_layer(hasty));
    let http = Http::new(serve(app).await);

    assert_eq!(http.send("GET", "/patient", &[]).await.status, 200);
    let started = Instant::now();
    let r = http.send("GET", "/patient", &[]).await;
    assert_eq!(r.status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );

    assert_eq!(http.send("GET", "/hasty", &[]).await.status, 200);
    let r = http.send("GET", "/hasty", &[]).await;
    assert_eq!(r.status, 429, "the wait exceeds the bound");
}

#[tokio::test]
async fn dry_run_never_rejects() {
    let (store, _clock) = manual_store();
    let layer = ThrottleLayer::new(
        store,
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .prefix("dry")
    .request_info(true)
    .dry_run();
    let app = Router::new().route("/", get(remaining).route_layer(layer));
    let http = Http::new(serve(app).await);
    assert_eq!(http.send("GET", "/", &[]).await.body, "ok 0");
    for _ in 0..5 {
        let r = http.send("GET", "/", &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "would be limited");
        assert_eq!(r.headers["ratelimit"], "\"default\";r=0;t=60");
    }
}

/// A store that always fails, or never answers (`not_limited` uses it too).
pub(crate) struct Broken {
    pub(crate) hang: bool,
}

impl Broken {
    async fn fail<T>(&self) -> Result<T, StoreError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        Err(StoreError::Connection("connection refused".into()))
    }
}

impl Store for Broken {
    async fn check(&self, _: Charge<'_>) -> Result<Decision, StoreError> {
        self.fail().await
    }
    async fn check_all(&self, _: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.fail().await
    }
    async fn refund(
        &self,
        _: &[u8],
        _: &Policy,
        _: &tower_throttle::decision::Receipt,
    ) -> Result<(), StoreError> {
        self.fail().await
    }
    async fn reset(&self, _: &[u8], _: &Policy) -> Result<(), StoreError> {
        self.fail().await
    }
    async fn release(
        &self,
        _: &[u8],
        _: &Policy,
        _: tower_throttle::decision::PermitId,
    ) -> Result<(), StoreError> {
        self.fail().await
    }
}

#[tokio::test]
async fn store_failures_fail_open_or_closed() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let closed = ThrottleLayer::new(Broken { hang: false }, policy);
    let open = ThrottleLayer::new(Broken { hang: false }, policy).fail_open();
    let timeout =
        ThrottleLayer::new(Broken { hang: true }, policy).store_timeout(Duration::from_millis(50));
    let app = Router::new()
        .route("/closed", get(remaining).route_layer(closed))
        .route("/open", get(remaining).route_layer(open))
        .route("/timeout", get(remaining).route_layer(timeout));
    let http = Http::new(serve(app).await);

    let r = http.send("GET", "/closed", &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!r.body.contains("refused"), "no internals leak: {}", r.body);
    for _ in 0..3 {
        let r = http.send("GET", "/open", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "unchecked"));
    }
    let started = Instant::now();
    let r = http.send("GET", "/timeout", &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn concurrency_permits_are_released_on_completion_and_cancel() {
    let store = MemoryStore::new();
    let upload = ThrottleLayer::new(store.clone(), Policy::concurrency(1).unwrap())
        .key(PeerIp::new())
        .prefix("upload")
        .request_info(true);
    async fn handler(headers: HeaderMap) -> &'static str {
        if headers.contains_key("x-hold") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        "uploaded"
    }
    let app = Router::new().route("/upload", post(handler).route_layer(upload));
    let addr = serve(app).await;
    let http = Http::new(addr);

    // Completed requests give their permit back.
    for _ in 0..3 {
        assert_eq!(http.post("/upload", &[]).await.status, 200);
    }

    // A request in flight holds the permit...
    let mut held = tokio::net::TcpStream::connect(addr).await.unwrap();
    held.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\nx-hold: 1\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut denied = false;
    for _ in 0..100 {
        if http.post("/upload", &[]).await.status == 429 {
            denied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(denied, "the held request owns the only permit");

    // ...until the client goes away and the server drops the request.
    drop(held);
    let mut admitted = false;
    for _ in 0..200 {
        if http.post("/upload", &[]).await.status == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(admitted, "the cancelled request released its permit");
}

#[tokio::test]
async fn layer_works_in_service_builder_and_router_layer() {
    let (store, _clock) = manual_store();
    let global = ThrottleLayer::new(
        store,
        Policy::fixed_window(2, Duration::from_secs(60)).unwrap(),
    )
    .key(PeerIp::new())
    .prefix("global")
    .request_info(true);
    let app = Router::new()
        .route("/a", get(remaining))
        .route("/b", get(remaining))
        .layer(tower::ServiceBuilder::new().layer(global));
    let http = Http::new(serve(app).await);
    assert_eq!(http.send("GET", "/a", &[]).await.status, 200);
    assert_eq!(http.send("GET", "/b", &[]).await.status, 200);
    assert_eq!(
        http.send("GET", "/a", &[]).await.status,
        429,
        "one counter across routes"
    );
}

#[test]
fn key_extractors_compose() {
    fn assert_extractor(_: impl KeyExtractor) {}
    assert_extractor((PeerIp::new(), FromExtension::<UserId>::new()).or(PeerIp::new()));
}

#[tokio::test]
async fn matched_path_and_request_cost() {
    let (store, _clock) = manual_store();
    // One bucket per route template, whatever the id; a request costs its `x-items`.
    let layer = ThrottleLayer::new(
        store,
        Policy::fixed_window(5, Duration::from_secs(60)).unwrap(),
    )
    .key(tower_throttle::key::MatchedPathKey)
    .request_info(true)
    .cost_fn(|req| {
        req.headers()
            .get("x-items")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let app = Router::new()
        .route("/items/{id}", post(remaining))
        .route("/other", post(remaining))
        .layer(layer);
    let http = Http::new(serve(app).await);
    assert_eq!(
        http.post("/items/1", &[("x-items", "3")]).await.body,
        "ok 2"
    );
    assert_eq!(http.post("/items/2", &[]).await.body, "ok 1");
    let r = http.post("/items/3", &[("x-items", "2")]).await;
    assert_eq!(r.status, 429, "3 + 1 + 2 > 5 across ids of one route");
    assert_eq!(
        http.post("/items/4", &[]).await.body,
        "ok 0",
        "the denied cost was not charged"
    );
    assert_eq!(http.post("/other", &[]).await.body, "ok 4");
    let r = http.post("/other", &[("x-items", "6")]).await;
    assert_eq!(r.status, 429);
    assert!(
        r.headers.get("retry-after").is_none(),
        "6 > 5 can never be admitted"
    );
}
