//! What a response costs to build and drop by its shape, with `http`
//! alone: the layer's plain-text 429 (its four fields cloned from a
//! prebuilt map, boxed as the layer boxes it) against a handler's
//! `text/plain` response (one field), and a 4-field map built by inserts.
//! The floor under the denied ÷ allowed bar (BENCHMARKS.md, "Denied and
//! allowed"). `cargo bench --bench response_shapes`; `SHAPES_ITERS`
//! (default 20,000,000) and three rounds.

use std::hint::black_box;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const TEXT_PLAIN: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");

fn per_iter(n: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n: u64 = std::env::var("SHAPES_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000_000);
    let mut fields = HeaderMap::with_capacity(4);
    fields.insert(CONTENT_TYPE, TEXT_PLAIN);
    fields.insert(RETRY_AFTER, HeaderValue::from_static("1"));
    fields.insert(
        RATELIMIT_POLICY,
        HeaderValue::from_static("\"default\";q=1;w=1"),
    );
    fields.insert(RATELIMIT, HeaderValue::from_static("\"default\";r=0;t=1"));
    let values: Vec<HeaderValue> = fields.values().cloned().collect();
    let body = Bytes::from_static(b"Too many requests: try again in 1 s.\n");
    println!("response_shapes: ns per response built and dropped, {n} per round");
    for round in 1..=3 {
        let text = per_iter(n, || {
            let mut r = Response::new(Bytes::from_static(b"ok"));
            r.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
            black_box(&r);
        });
        let limited = per_iter(n, || {
            let mut r = Box::new(Response::new(black_box(&body).clone()));
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            *r.headers_mut() = black_box(&fields).clone();
            black_box(&r);
        });
        let map_clone = per_iter(n, || {
            black_box(black_box(&fields).clone());
        });
        let map_inserts = per_iter(n, || {
            let v = black_box(&values);
            let mut m = HeaderMap::with_capacity(4);
            m.insert(CONTENT_TYPE, v[0].clone());
            m.insert(RETRY_AFTER, v[1].clone());
            m.insert(RATELIMIT_POLICY, v[2].clone());
            m.insert(RATELIMIT, v[3].clone());
            black_box(m);
        });
        println!(
            "round {round}: text/plain response (1 field) {text:.1}, plain-text 429 \
             (4 fields cloned, boxed) {limited:.1}, the 4-field map cloned {map_clone:.1}, \
             built by inserts {map_inserts:.1}"
        );
    }
}
