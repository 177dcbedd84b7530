//! What a file says beyond rules and keys (feature `config`), each option
//! checked against the same layer built in code: same requests, same
//! statuses and fields. And every value a file or a client controls at
//! its edges.

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{Extractors, LayerConfig};
use tower_throttle::key::FromExtension;
use tower_throttle::meter::ReportedCost;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

mod fields;
mod keys;
mod rules;

const MINUTE: Duration = Duration::from_secs(60);

fn frozen() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

/// The user id an authentication layer puts in the extensions.
#[derive(Clone)]
struct UserId(u32);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "u{}", self.0)
    }
}

/// The plan an authentication layer puts in the extensions.
#[derive(Clone)]
struct Plan(&'static str);

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

fn extractors() -> Extractors {
    Extractors::new()
        .with("user_id", FromExtension::<UserId>::new())
        .with("plan", FromExtension::<Plan>::new())
}

/// Answers with `x-status` as its status and `x-used` as a `ReportedCost`.
fn inner(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|req: Request<()>| async move {
        let header = |name: &str| req.headers().get(name)?.to_str().ok()?.parse::<u64>().ok();
        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
        if let Some(status) = header("x-status") {
            *response.status_mut() = StatusCode::from_u16(status as u16).unwrap();
        }
        if let Some(used) = header("x-used") {
            response.extensions_mut().insert(ReportedCost(used));
        }
        Ok(response)
    })
}

/// One request: method, path, headers, and the extensions auth would set.
#[derive(Clone)]
struct Ask {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, Vec<u8>)>,
    user: Option<u32>,
    plan: Option<&'static str>,
}

fn ask(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: Vec::new(),
        user: Some(1),
        plan: None,
    }
}

impl Ask {
    fn header(mut self, name: &'static str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name, value.as_ref().to_vec()));
        self
    }
    fn request(&self) -> Request<()> {
        let mut b = Request::builder().method(self.method).uri(self.path);
        for (name, value) in &self.headers {
            b = b.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let mut req = b.body(()).unwrap();
        if let Some(u) = self.user {
            req.extensions_mut().insert(UserId(u));
        }
        if let Some(p) = self.plan {
            req.extensions_mut().insert(Plan(p));
        }
        req
    }
}

/// What a client sees of an answer: status, the rate-limit fields, body.
async fn answer<S>(svc: &mut S, ask: &Ask) -> (StatusCode, Vec<(String, String)>, Bytes)
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>>,
    S::Error: fmt::Debug,
{
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(ask.request())
        .await
        .unwrap();
    let status = response.status();
    let fields = rate_fields(response.headers());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, fields, body)
}

fn rate_fields(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| {
            n.as_str().contains("ratelimit") || *n == "retry-after" || *n == "content-type"
        })
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    fields.sort();
    fields
}

/// Sends `asks` through a layer built from `file` and through `code`'s,
/// each on a store of its own on a frozen clock: every answer the same.
async fn same_answers(file: &str, code: ThrottleLayer<MemoryStore<ManualClock>>, asks: &[Ask]) {
    let config = LayerConfig::parse("limits.yaml", file).unwrap();
    let from_file = config.layer_with(frozen(), &extractors()).unwrap();
    let mut a = from_file.layer(inner());
    let mut b = code.layer(inner());
    for (i, ask) in asks.iter().enumerate() {
        let (x, y) = (answer(&mut a, ask).await, answer(&mut b, ask).await);
        assert_eq!(x, y, "request {i} ({} {}) of\n{file}", ask.method, ask.path);
    }
}

const RULE: &str =
    "rules: [{ name: reply, policy: { fixed_window: { limit: 2, window: 60s } } }]\n";

fn reply() -> Policy {
    Policy::fixed_window(2, MINUTE).unwrap()
}

fn code(key: impl tower_throttle::key::KeyExtractor) -> ThrottleLayer<MemoryStore<ManualClock>> {
    ThrottleLayer::new(frozen(), reply()).name("reply").key(key)
}
