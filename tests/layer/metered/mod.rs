//! Costs settled after the response ([`tower_throttle::meter`]): an estimate
//! charged at admission, the actual cost (reported by the handler, bytes
//! streamed, a number in the trailers) settled through the receipt. Each
//! handler answers with the `tokens` rule's remaining quota as it saw it at
//! admission (`x-remaining`), so the tests read the store's count through
//! the layer, on a clock that moves only when a test says so.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tower::{Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{Global, RequestHead};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, Rule, Store, ThrottleLayer};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

mod bounds;
mod settling;

const MINUTE: Duration = Duration::from_secs(60);

/// The request's estimate: its `x-max` header.
fn estimate(req: &RequestHead<'_>) -> u64 {
    let max = req.headers().get("x-max").and_then(|v| v.to_str().ok());
    max.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Answers with `x-remaining` (the tokens rule's, at admission) and, per
/// the request: `x-used` as a `ReportedCost`, `x-chunks` data frames of 50
/// bytes, `x-trailer` as an `x-usage-tokens` trailer; `x-status` as status.
async fn handler(req: Request<()>) -> Result<Response<Body>, Infallible> {
    let info = req.extensions().get::<RateLimitInfo>().cloned();
    let header = |name: &str| -> Option<u64> {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
    };
    let chunks = header("x-chunks").unwrap_or(0);
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..chunks)
        .map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; 50]))))
        .collect();
    if let Some(tokens) = header("x-trailer") {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage-tokens", HeaderValue::from(tokens));
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let mut response = Response::new(StreamBody::new(stream::iter(frames)).boxed());
    if let Some(used) = header("x-used") {
        response.extensions_mut().insert(ReportedCost(used));
    }
    if let Some(status) = header("x-status") {
        *response.status_mut() = StatusCode::from_u16(status as u16).unwrap();
    }
    let remaining = info.and_then(|i| i.get("tokens").map(|d| d.remaining));
    if let Some(remaining) = remaining {
        response
            .headers_mut()
            .insert("x-remaining", HeaderValue::from(remaining));
    }
    Ok(response)
}

fn req(headers: &[(&str, u64)]) -> Request<()> {
    let mut b = Request::builder().uri("/v1/chat");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(()).unwrap()
}

/// Sends a request and reads its body to the end: `(status, x-remaining)`.
async fn send<S>(svc: &mut S, headers: &[(&str, u64)]) -> (StatusCode, Option<u64>)
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let response = svc.ready().await.unwrap().call(req(headers)).await.unwrap();
    let status = response.status();
    let remaining =
        (response.headers().get("x-remaining")).map(|v| v.to_str().unwrap().parse().unwrap());
    response.into_body().collect().await.unwrap();
    (status, remaining)
}

fn tokens(actual: ActualCost) -> Rule {
    Rule::new("tokens", Policy::fixed_window(100, MINUTE).unwrap())
        .cost_fn(estimate)
        .settle_cost(actual)
}

fn layer<St: Store>(store: St, tokens: Rule) -> ThrottleLayer<St> {
    // A generous request limit beside the metered rule: the layer's first.
    ThrottleLayer::new(store, Policy::fixed_window(1_000, MINUTE).unwrap())
        .name("requests")
        .cost(1)
        .key(Global)
        .and(tokens)
        .request_info(true)
        .headers_on_allowed(true)
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(clock.clone()).build()
}
