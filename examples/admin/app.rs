//! The routers of the admin example (`examples/admin.rs`), apart so that
//! its test (`tests/layer/admin_example.rs`) builds the very same ones.
//!
//! * the API: `GET /hello`, 5 requests a minute and 100 a day per signed-in
//!   user, 300 a minute per client address, all in one layer;
//! * the admin router: `GET /admin/limits/{user}` (the user's key under
//!   every rule: remaining, limit, reset; `?ip=` adds an address, for the
//!   rules keyed by it), `DELETE /admin/limits/{user}` (a fresh quota), and
//!   `GET /admin/hottest` (the hottest keys, each count exact or with its
//!   bounds). The layer runs its own extractors on what the admin knows,
//!   so these handlers never build a store key.

use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tower_throttle::inspect::{Client, KeyStates, RuleState};
use tower_throttle::key::{FromExtension, PeerIp};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::store::hottest::KeyActivity;
use tower_throttle::store::{BoxStore, Hottest};
use tower_throttle::{Policy, PolicyError, Rule, StoreError, ThrottleLayer};

/// The API's limits, on a store that counts its hottest keys (whatever
/// decides behind it: memory, Redis, a fallback).
pub type Limits = ThrottleLayer<Hottest<BoxStore>>;

/// The signed-in user, as an auth layer records it.
#[derive(Clone, Debug)]
pub struct UserId(pub String);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The API's rules on `store`.
pub fn limits(store: BoxStore) -> Result<Limits, PolicyError> {
    let store = Hottest::new(store, 64, Duration::from_secs(60));
    let minute = Duration::from_secs(60);
    Ok(
        ThrottleLayer::new(store, Policy::sliding_window(5, minute)?)
            .name("minute")
            .key(FromExtension::<UserId>::new())
            .and(Rule::new(
                "day",
                Policy::fixed_window(100, Duration::from_secs(86_400))?,
            ))
            .and(Rule::new("per-ip", Policy::sliding_window(300, minute)?).key(PeerIp::new()))
            .prefix("api")
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
    )
}

/// Demo authentication: `Authorization: Bearer <user>` signs in as
/// `<user>`. A real app verifies a token here.
async fn auth(mut req: Request, next: Next) -> Response {
    let user = (req.headers().get("authorization"))
        .and_then(|v| v.to_str().ok()?.strip_prefix("Bearer "))
        .filter(|u| !u.is_empty() && u.len() <= 64)
        .map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

/// The rate-limited API (auth runs first: it is the outer layer).
pub fn api(limits: Limits) -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .layer(limits)
        .layer(middleware::from_fn(auth))
}

/// The admin router: serve it on a listener only operators reach.
pub fn admin(limits: Limits) -> Router {
    Router::new()
        .route("/admin/limits/{user}", get(peek_user).delete(reset_user))
        .route("/admin/hottest", get(hottest))
        .with_state(limits)
}

/// The client the admin asks about: the user, as the auth layer would
/// record them, and the address of `?ip=`, if given.
fn client(user: &str, query: Option<&str>) -> Result<Client, (StatusCode, String)> {
    let mut client = Client::extension(UserId(user.to_owned()));
    let ip = query.and_then(|q| q.split('&').find_map(|p| p.strip_prefix("ip=")));
    if let Some(ip) = ip {
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| (StatusCode::BAD_REQUEST, format!("not an address: {ip}\n")))?;
        client = client.and_peer_ip(ip);
    }
    Ok(client)
}

fn unavailable(error: StoreError) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, format!("store: {error}\n"))
}

async fn peek_user(
    State(limits): State<Limits>,
    Path(user): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, (StatusCode, String)> {
    let client = client(&user, query.as_deref())?;
    let states = limits.peek_request(&client).await.map_err(unavailable)?;
    Ok(Json(states_json(&user, &states)))
}

async fn reset_user(
    State(limits): State<Limits>,
    Path(user): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, (StatusCode, String)> {
    let client = client(&user, query.as_deref())?;
    let reset = limits.reset_request(&client).await.map_err(unavailable)?;
    Ok(Json(states_json(&user, &reset)))
}

async fn hottest(State(limits): State<Limits>) -> Json<Value> {
    let report = limits.store().hottest_keys(20);
    Json(json!({
        "span_ms": report.span.as_millis() as u64,
        "checks": report.checks,
        "denials": report.denials,
        "sample_every": report.sample_every,
        "by_checks": report.by_checks.iter().map(activity_json).collect::<Vec<_>>(),
        "by_denials": report.by_denials.iter().map(activity_json).collect::<Vec<_>>(),
    }))
}

fn states_json(user: &str, states: &KeyStates) -> Value {
    json!({ "user": user, "rules": states.iter().map(rule_json).collect::<Vec<_>>() })
}

/// One rule: its key and state, its key alone after a reset, or why the
/// admin's input gives it no key (a rule keyed by address, no `?ip=`).
fn rule_json(state: &RuleState) -> Value {
    match (&state.key, &state.decision) {
        (Ok(key), Some(d)) => json!({
            "rule": &*state.rule,
            "key": String::from_utf8_lossy(key),
            "limit": d.limit,
            "remaining": d.remaining,
            "reset_after_ms": d.reset_after.as_millis() as u64,
        }),
        (Ok(key), None) => json!({
            "rule": &*state.rule,
            "key": String::from_utf8_lossy(key),
            "reset": true,
        }),
        (Err(missing), _) => json!({
            "rule": &*state.rule,
            "key": null,
            "missing": missing.reason(),
        }),
    }
}

/// A key's count as the summary knows it: `count` is an upper bound,
/// `lower_bound` the least it can be, `shown` both for a person.
fn activity_json(k: &KeyActivity) -> Value {
    json!({
        "key": String::from_utf8_lossy(&k.key),
        "count": k.count,
        "lower_bound": k.lower_bound,
        "exact": k.is_exact(),
        "shown": k.count_display().to_string(),
    })
}
