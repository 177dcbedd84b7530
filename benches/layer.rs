//! One request through a bare service, through ThrottleLayer (memory store)
//! and through tower_governor's GovernorLayer, in process: ns per request on
//! the allowed path (10,000 users round robin) and on the denied path (one
//! abusive user). A third group sends the allowed requests to a handler that
//! answers like axum's `"ok".into_response()` (a `text/plain` response, the
//! shape of the layer's own 429), for the denied ÷ allowed comparison with a
//! handler that does anything at all. `cargo bench --bench layer`.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::IntoResponse;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderValue, Request, Response};
use tower::{Layer, Service, ServiceExt};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use tower_throttle::body::ThrottleBody;
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[path = "common/user_header.rs"]
mod user_header;
use user_header::{UserHeader, USER};

const USERS: usize = 10_000;

fn inner() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone {
    tower::service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::from("ok"))) })
}

/// A handler answering `"ok"` as axum does: with a `content-type` header.
fn text_inner() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok("ok".into_response()) })
}

fn users() -> Vec<HeaderValue> {
    (0..USERS)
        .map(|i| HeaderValue::from_str(&format!("user-{i}")).unwrap())
        .collect()
}

/// The plan an auth layer records (the per-request policy cases).
#[derive(Clone, Copy)]
struct Tier(u8);

/// Sends `iters` requests through `svc` on a current-thread runtime.
fn drive<S, B>(svc: &S, users: &[HeaderValue], iters: u64) -> Duration
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    drive_with(svc, users, iters, false)
}

/// [`drive`], each request carrying a [`Tier`] extension if `tiered`.
fn drive_with<S, B>(svc: &S, users: &[HeaderValue], iters: u64, tiered: bool) -> Duration
where
    S: Service<Request<Body>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut svc = svc.clone();
    rt.block_on(async {
        let start = Instant::now();
        for i in 0..iters as usize {
            let mut req = Request::builder()
                .uri("/reply")
                .header(USER, users[i % users.len()].clone())
                .body(Body::empty())
                .unwrap();
            if tiered {
                req.extensions_mut().insert(Tier(1));
            }
            let ready = svc.ready().await.unwrap();
            black_box(ready.call(req).await.unwrap().status());
        }
        start.elapsed()
    })
}

fn path(c: &mut Criterion, group: &str, per_user: u32, users: Vec<HeaderValue>) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    let bare = inner();
    let ours = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(u64::from(per_user) - 1, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .layer(inner());
    // The same with the `RateLimitInfo` request extension (two allocations).
    let with_info = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(u64::from(per_user) - 1, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .request_info(true)
    .layer(inner());
    // A policy per request from the `Tier` extension (the same algorithm,
    // another burst), against the static policy on the same tiered requests.
    let static_tiered = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(u64::from(per_user) - 1, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .layer(inner());
    let premium = Policy::cell(u64::from(per_user) * 2 - 1, 2, Duration::from_secs(1)).unwrap();
    let per_request = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(u64::from(per_user) - 1, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .policy_from_extension(move |t: &Tier| (t.0 == 1).then_some(premium))
    .layer(inner());
    let config = || {
        GovernorConfigBuilder::default()
            .key_extractor(UserHeader)
            .period(Duration::from_secs(1))
            .burst_size(per_user)
            .finish()
            .unwrap()
    };
    let governed = GovernorLayer::new(config()).layer(inner());
    // tower_governor answering with our response type (`ThrottleBody`): what
    // the body wrapper alone costs.
    let governed_wrapped = tower::util::MapResponse::new(
        GovernorLayer::new(config()).layer(inner()),
        |r: Response<Body>| r.map(ThrottleBody::inner),
    );
    // Exhaust (denied path) or warm (allowed path) both limiters alike.
    drive(&ours, &users, users.len() as u64 * 2);
    drive(&with_info, &users, users.len() as u64 * 2);
    drive(&governed, &users, users.len() as u64 * 2);
    drive(&governed_wrapped, &users, users.len() as u64 * 2);
    drive_with(&static_tiered, &users, users.len() as u64 * 4, true);
    drive_with(&per_request, &users, users.len() as u64 * 4, true);
    g.bench_function("bare", |b| b.iter_custom(|n| drive(&bare, &users, n)));
    g.bench_function("tower_throttle", |b| {
        b.iter_custom(|n| drive(&ours, &users, n))
    });
    g.bench_function("tower_throttle_with_request_info", |b| {
        b.iter_custom(|n| drive(&with_info, &users, n))
    });
    g.bench_function("tower_throttle_tiered_requests_static_policy", |b| {
        b.iter_custom(|n| drive_with(&static_tiered, &users, n, true))
    });
    g.bench_function("tower_throttle_policy_from_extension", |b| {
        b.iter_custom(|n| drive_with(&per_request, &users, n, true))
    });
    g.bench_function("tower_governor", |b| {
        b.iter_custom(|n| drive(&governed, &users, n))
    });
    g.bench_function("tower_governor_with_throttle_body", |b| {
        b.iter_custom(|n| drive(&governed_wrapped, &users, n))
    });
    g.finish();
}

fn allowed(c: &mut Criterion) {
    path(c, "layer_allowed_10k_users", 1_000_000, users());
}

fn denied(c: &mut Criterion) {
    path(c, "layer_denied_one_user", 1, users()[..1].to_vec());
}

/// Allowed requests to the `text/plain` handler: the same response shape as
/// a 429 (status, `content-type`, a short body).
fn allowed_text(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer_allowed_text_handler");
    g.throughput(Throughput::Elements(1));
    let users = users();
    let bare = text_inner();
    let ours = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(999_999, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .layer(text_inner());
    drive(&ours, &users, users.len() as u64 * 2);
    g.bench_function("bare", |b| b.iter_custom(|n| drive(&bare, &users, n)));
    g.bench_function("tower_throttle", |b| {
        b.iter_custom(|n| drive(&ours, &users, n))
    });
    g.finish();
}

criterion_group!(benches, allowed, denied, allowed_text);
criterion_main!(benches);
