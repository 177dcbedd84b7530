//! Traffic for the layer benches that share it (`boxed.rs`,
//! `layer_paired.rs`, `denied_paired.rs`, through `#[path]`): a handler
//! answering `"ok"`, requests keyed by the `x-user` header, users taken
//! round robin, and the paired benches' batches, bounds and quantiles.

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Instant;

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response};
use tower::{Service, ServiceExt};

/// The inner service: `200 ok`, nothing else.
pub fn inner() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok(Response::new(Body::from("ok"))) })
}

/// `user-0` … `user-{n-1}`.
pub fn users(n: usize) -> Vec<HeaderValue> {
    (0..n)
        .map(|i| HeaderValue::from_str(&format!("user-{i}")).unwrap())
        .collect()
}

/// Sends `n` requests through `svc`, each built in the loop (so a bare
/// service's time is the floor), header `name` set to the next user.
pub async fn send<S, B>(svc: &mut S, name: &HeaderName, users: &[HeaderValue], n: usize)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    for i in 0..n {
        let req = Request::builder()
            .uri("/reply")
            .header(name, users[i % users.len()].clone())
            .body(Body::empty())
            .unwrap();
        let ready = svc.ready().await.unwrap();
        black_box(ready.call(req).await.unwrap().status());
    }
}

/// [`send`]s `n` requests through `svc`: ns per request.
#[allow(dead_code)] // not every bench times batches
pub async fn batch<S, B>(svc: &mut S, name: &HeaderName, users: &[HeaderValue], n: usize) -> f64
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    send(svc, name, users, n).await;
    start.elapsed().as_nanos() as f64 / n as f64
}

/// The environment variable `name` as a number, else `default`.
#[allow(dead_code)]
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `q` quantile of `v` (sorted in place), nearest rank.
#[allow(dead_code)]
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}
