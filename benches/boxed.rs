//! What `BoxStore` costs over the store it wraps: a memory-store check
//! (synchronous fast path and asynchronous `check`), and one request
//! through `ThrottleLayer` with each store, 10,000 users round robin, every check admitted.
//! `cargo bench --bench boxed`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::body::Body;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderValue, Request, Response};
use tower::{Layer, Service};
use tower_throttle::key::HeaderKey;
use tower_throttle::store::BoxStore;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, Store, ThrottleLayer};

// The shared module also holds a key extractor this bench does not use.
#[allow(dead_code)]
#[path = "common/user_header.rs"]
mod user_header;
use user_header::USER;

#[path = "common/traffic.rs"]
mod traffic;
use traffic::{inner, send, users};

const USERS: usize = 10_000;

fn policy() -> Policy {
    Policy::cell(999_999, 1_000_000_000, Duration::from_secs(1)).unwrap()
}

fn keys() -> Vec<Vec<u8>> {
    (0..USERS)
        .map(|i| format!("user:{i:08}:reply").into_bytes())
        .collect()
}

fn decide<S: Store>(store: &S, keys: &[Vec<u8>], iters: u64) -> Duration {
    let p = policy();
    let start = Instant::now();
    for i in 0..iters as usize {
        let rule = [Charge::new(&keys[i % USERS], &p, 1)];
        black_box(store.decide(&rule).ready().unwrap().unwrap());
    }
    start.elapsed()
}

fn check_async<S: Store>(store: &S, keys: &[Vec<u8>], iters: u64) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let p = policy();
    rt.block_on(async {
        let start = Instant::now();
        for i in 0..iters as usize {
            let rule = Charge::new(&keys[i % USERS], &p, 1);
            black_box(store.check(rule).await.unwrap());
        }
        start.elapsed()
    })
}

fn store_check(c: &mut Criterion) {
    let keys = keys();
    let mut g = c.benchmark_group("store_check");
    g.throughput(Throughput::Elements(1));
    let plain = MemoryStore::new();
    let boxed = BoxStore::new(MemoryStore::new());
    g.bench_function("memory/decide", |b| {
        b.iter_custom(|n| decide(&plain, &keys, n))
    });
    g.bench_function("boxed/decide", |b| {
        b.iter_custom(|n| decide(&boxed, &keys, n))
    });
    g.bench_function("memory/check", |b| {
        b.iter_custom(|n| check_async(&plain, &keys, n))
    });
    g.bench_function("boxed/check", |b| {
        b.iter_custom(|n| check_async(&boxed, &keys, n))
    });
    g.finish();
}

fn drive<S, B>(svc: &S, users: &[HeaderValue], iters: u64) -> Duration
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
        send(&mut svc, &USER, users, iters as usize).await;
        start.elapsed()
    })
}

fn layer(c: &mut Criterion) {
    let users = users(USERS);
    let mut g = c.benchmark_group("layer_allowed");
    g.throughput(Throughput::Elements(1));
    let plain = ThrottleLayer::new(MemoryStore::new(), policy())
        .key(HeaderKey::new(USER))
        .layer(inner());
    let boxed = ThrottleLayer::new(BoxStore::new(MemoryStore::new()), policy())
        .key(HeaderKey::new(USER))
        .layer(inner());
    g.bench_function("memory", |b| b.iter_custom(|n| drive(&plain, &users, n)));
    g.bench_function("boxed", |b| b.iter_custom(|n| drive(&boxed, &users, n)));
    g.finish();
}

criterion_group!(benches, store_check, layer);
criterion_main!(benches);
