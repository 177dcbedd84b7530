//! The layer over real TCP: an axum server on 127.0.0.1:0, hyper's client.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Extension, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tower_throttle::clock::ManualClock;
use tower_throttle::key::FromExtension;
use tower_throttle::mode::OnMissingKey;
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, Store, StoreError, ThrottleLayer};

mod keys_and_rules;
mod modes;
mod wiring;

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
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        let _ = charges;
        tower_throttle::store::Answer::Later(async move { self.fail().await })
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
