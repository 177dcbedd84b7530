//! The HTTP listeners: `POST /json` and `GET /healthcheck` (`HOST:PORT`),
//! the debug listener's `/rlconfig` (`DEBUG_HOST:DEBUG_PORT`), and the
//! Prometheus endpoint (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`).

pub mod protojson;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::Query;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tower_throttle::clock::ManualClock;

use crate::health::Health;
use crate::service::RateLimiter;

/// What the handlers share.
#[derive(Clone)]
pub struct Shared {
    /// The service.
    pub limiter: Arc<RateLimiter>,
    /// Health.
    pub health: Arc<Health>,
    /// `RLS_TEST_CLOCK`: the clock `/test/clock` sets.
    pub test_clock: Option<ManualClock>,
}

/// `/json` and `/healthcheck`.
pub fn main_router(shared: Shared) -> Router {
    Router::new()
        .route("/json", any(json))
        .route("/healthcheck", get(healthcheck))
        .with_state(shared)
}

/// `/rlconfig` and an index of the endpoints (and `/test/clock` in test
/// mode).
pub fn debug_router(shared: Shared) -> Router {
    let router = if shared.test_clock.is_some() {
        Router::new().route("/test/clock", post(set_clock))
    } else {
        Router::new()
    };
    router
        .route("/rlconfig", get(rlconfig))
        .route(
            "/",
            get(|| async {
                "/rlconfig: print out the currently loaded configuration for debugging\n"
            }),
        )
        .with_state(shared)
}

/// The metrics at `path`.
pub fn metrics_router(shared: Shared, path: &str) -> Router {
    Router::new().route(path, get(metrics)).with_state(shared)
}

/// Go's `http.Error`: the status text, as plain text.
fn status_text(code: StatusCode) -> Response {
    let text = format!("{}\n", code.canonical_reason().unwrap_or(""));
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn json(State(s): State<Shared>, body: Bytes) -> Response {
    let request = match protojson::request(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "bad /json request");
            return status_text(StatusCode::BAD_REQUEST);
        }
    };
    let response = match s.limiter.should_rate_limit(request).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "/json request failed");
            return status_text(StatusCode::BAD_REQUEST);
        }
    };
    let status = match Code::try_from(response.overall_code) {
        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
        Ok(Code::Ok) => StatusCode::OK,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = protojson::response(&response).to_string();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn healthcheck(State(s): State<Shared>) -> Response {
    if s.health.is_healthy() {
        "OK".into_response()
    } else {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn rlconfig(State(s): State<Shared>) -> String {
    s.limiter.dump()
}

async fn metrics(State(s): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.limiter.metrics().render(),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct ClockQuery {
    now_unix: u64,
}

/// `POST /test/clock?now_unix=N`: the rate-limit clock reads N seconds.
async fn set_clock(State(s): State<Shared>, Query(q): Query<ClockQuery>) -> StatusCode {
    match (&s.test_clock, q.now_unix.checked_mul(1_000_000_000)) {
        (Some(clock), Some(ns)) => {
            clock.set_ns(ns);
            StatusCode::NO_CONTENT
        }
        _ => StatusCode::BAD_REQUEST,
    }
}
