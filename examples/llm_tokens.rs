//! An LLM-style API metered in tokens: 2,000 tokens a minute per API key,
//! and 20 requests a minute. A request is admitted on its `max_tokens`
//! (an upper bound, so the limit is exact) and settled with the tokens the
//! model produced once the response is known:
//!
//! * `POST /v1/completions?max_tokens=N` answers at once and reports its
//!   usage as a `ReportedCost` response extension;
//! * `POST /v1/stream?max_tokens=N` streams one token per chunk and reports
//!   its usage in an `x-usage-tokens` trailer when the stream ends.
//!
//! Run `cargo run --example llm_tokens --features axum` (port `PORT`,
//! default 3000) and try the printed `curl` lines: the `RateLimit` field
//! shows the estimate taken at admission; the next request shows the rest
//! given back.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Query;
use axum::http::{HeaderMap, HeaderValue, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body::Frame;
use tower_throttle::key::{BearerToken, RequestHead};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

#[derive(serde::Deserialize)]
struct Ask {
    max_tokens: u64,
}

/// The estimate charged at admission: the request's `max_tokens`, the most
/// the model may produce (256 when absent, as the handlers assume). A
/// client's `max_tokens=0` is charged as 1 (a settled rule's estimate never
/// goes below 1), so it cannot pass a spent quota.
fn max_tokens(req: &RequestHead<'_>) -> u64 {
    let query = req.uri().query().unwrap_or("");
    (query.split('&'))
        .find_map(|pair| pair.strip_prefix("max_tokens=")?.parse().ok())
        .unwrap_or(256)
}

/// What the "model" produces: fewer tokens than asked for, as models do,
/// and never more (so `max_tokens` is an upper bound).
fn generate(max_tokens: u64) -> Vec<&'static str> {
    let words = [
        "rate", "limits", "keep", "the", "lights", "on", "for", "everyone",
    ];
    let n = (max_tokens / 3).clamp(1, 64).min(max_tokens) as usize;
    words.iter().cycle().take(n).copied().collect()
}

async fn completions(Query(ask): Query<Ask>) -> Response<Body> {
    let tokens = generate(ask.max_tokens);
    let mut response = Response::new(Body::from(tokens.join(" ") + "\n"));
    response
        .extensions_mut()
        .insert(ReportedCost(tokens.len() as u64));
    response
}

async fn stream(Query(ask): Query<Ask>) -> Response<Body> {
    let tokens = generate(ask.max_tokens);
    let used = tokens.len() as u64;
    let chunks = tokens
        .into_iter()
        .map(|t| Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{t} ")))));
    let mut trailers = HeaderMap::new();
    trailers.insert("x-usage-tokens", HeaderValue::from(used));
    let frames = chunks.chain([Ok(Frame::trailers(trailers))]);
    Response::new(Body::new(http_body_util::StreamBody::new(
        futures_util::stream::iter(frames),
    )))
}

fn limits(actual: ActualCost) -> Result<ThrottleLayer<MemoryStore>, Box<dyn std::error::Error>> {
    let tokens = Rule::new(
        "tokens",
        Policy::fixed_window(2_000, Duration::from_secs(60))?,
    )
    .cost_fn(max_tokens)
    .settle_cost(actual);
    Ok(ThrottleLayer::new(
        MemoryStore::new(),
        Policy::fixed_window(20, Duration::from_secs(60))?,
    )
    .name("requests")
    .key(BearerToken)
    .and(tokens)
    .headers_on_allowed(true))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let app = Router::new()
        .route(
            "/v1/completions",
            post(completions).layer(limits(ActualCost::Reported)?),
        )
        .route(
            "/v1/stream",
            post(stream).layer(limits(ActualCost::Trailer("x-usage-tokens".parse()?))?),
        );
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    println!("  curl -si -X POST -H 'authorization: Bearer k1' 'http://{addr}/v1/completions?max_tokens=600'");
    println!("  curl -si -X POST -H 'authorization: Bearer k1' 'http://{addr}/v1/completions?max_tokens=1500'");
    println!("  curl -si --raw -X POST -H 'authorization: Bearer k1' -H 'te: trailers' 'http://{addr}/v1/stream?max_tokens=90'");
    axum::serve(listener, app).await?;
    Ok(())
}
