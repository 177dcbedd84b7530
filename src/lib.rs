//! Exact rate limiting for [tower] services and for plain code.
//!
//! A UGC site wants a user to reply at most 5 times a minute, post in bursts
//! of 15 then 30 an hour, and like at a steady rate. This crate gives each of
//! those a [`Policy`], keeps the counters in a [`Store`] (in memory by
//! default, Redis when several app instances must share limits), and answers
//! every check with a [`Decision`] shaped like redis-cell's `CL.THROTTLE`.
//!
//! # Without HTTP
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::{Limiter, MemoryStore, Policy};
//!
//! # tokio_test_block_on(async {
//! let replies = Limiter::new(MemoryStore::new(), Policy::sliding_log(5, Duration::from_secs(60))?);
//! for _ in 0..5 {
//!     assert!(replies.check("user-42:reply").await?.allowed);
//! }
//! let sixth = replies.check("user-42:reply").await?;
//! assert!(!sixth.allowed);
//! assert!(sixth.retry_after.unwrap() <= Duration::from_secs(60));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
//!
//! # Over HTTP
//!
//! [`ThrottleLayer`] is tower middleware for any `Service<http::Request<B>>`
//! (axum, hyper, tonic). Each [`Rule`] pairs a policy with a
//! [`key`] extractor and a cost; a denied request gets a `429` with
//! `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit` fields, and
//! never reaches the inner service. A denied gRPC call gets the gRPC answer
//! instead, `RESOURCE_EXHAUSTED` with a `google.rpc.RetryInfo` delay: see
//! [`grpc`] (feature `grpc` for tonic's peer address). See [`Mode`] for delaying or dry-running
//! instead, [`FailMode`] for store failures, and [`RateLimitInfo`] for what
//! handlers can read.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::post, Router};
//! use tower_throttle::{key::BearerToken, MemoryStore, Policy, ThrottleLayer};
//!
//! let store = MemoryStore::new();
//! // Posts: bursts of 16, then 30 an hour, per bearer token.
//! let posts = ThrottleLayer::new(store, Policy::cell(15, 30, Duration::from_secs(3600))?)
//!     .key(BearerToken)
//!     .prefix("post");
//! let app: Router = Router::new().route("/post", post(|| async { "posted" }).route_layer(posts));
//! # let _ = app;
//! # Ok::<(), tower_throttle::PolicyError>(())
//! ```
//!
//! # Limits shared by every instance: Redis
//!
//! With the `redis` feature a [`RedisStore`] keeps the counters in Redis
//! (one server, Sentinel, or a cluster; `rediss://` with `tls`), so every
//! instance of an app enforces one limit. Each check is one atomic script
//! on the server's clock, and a layer or limiter takes it like any store:
//! see [`store::redis`] for failures, timeouts and batching.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_throttle::{key::BearerToken, Policy, RedisStore, ThrottleLayer};
//!
//! let store = RedisStore::builder()
//!     .prefix("myapp")
//!     .timeout(Duration::from_millis(50))
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//! let posts = ThrottleLayer::new(store, Policy::cell(15, 30, Duration::from_secs(3600))?)
//!     .key(BearerToken)
//!     .prefix("post");
//! # let _ = posts;
//! # Ok(())
//! # }
//! ```
//!
//! # Cargo features
//!
//! On docs.rs every item that needs a feature carries its badge.
//!
//! | feature | what it adds |
//! |---|---|
//! | `axum` (default) | [`key::MatchedPathKey`], and [`key::PeerIp`] reads axum's `ConnectInfo` |
//! | `redis` | [`RedisStore`], [`store::RedisClusterStore`], [`store::CellStore`] (Redis with the redis-cell module): [`store::redis`] |
//! | `tls` | `redis`, and `rediss://` for every Redis store (rustls) |
//! | `governor` | [`store::GovernorStore`]: GCRA on governor's keyed limiter, in memory |
//! | `metrics` | request counters and a store-latency histogram through the `metrics` facade |
//! | `grpc` | [`key::PeerIp`] reads tonic's peer address (the gRPC answers of [`grpc`] need no feature) |
//! | `grpc-tls` | `grpc`, and tonic's peer address on TLS connections |
//! | `config` | [`config`]: layers read from YAML, TOML or JSON, checked before traffic, reloaded while serving |
//! | `conformance` | [`store::conformance`]: the suite a store of your own passes with one call |
//!
//! # The algorithms
//!
//! | constructor | semantics | memory per key |
//! |---|---|---|
//! | [`Policy::cell`] | GCRA, exactly redis-cell's `CL.THROTTLE` | one `u64` |
//! | [`Policy::funnel`], [`Policy::token_bucket`] | the same machine, limit = capacity | one `u64` |
//! | [`Policy::sliding_log`] | exact count over a sliding window | O(max) |
//! | [`Policy::fixed_window`] | `INCR` per aligned window | two `u64` |
//! | [`Policy::sliding_window`] | weighted two-window estimate | three `u64` |
//! | [`Policy::concurrency`] | requests in flight, leased permits | O(max) |
//!
//! Each is a pure function in [`algorithm`]; every store implements exactly
//! those definitions, and the tests hold each store to a reference model.
//!
//! [tower]: https://docs.rs/tower

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

// Two floors (see ARCHITECTURE.md; `floors::tests` enforces them). The
// engine — policies, algorithms, decisions, clocks, stores and the direct
// API — knows nothing of HTTP, tower or a request. The middleware — the
// tower layer, service and response future, key extractors, one request's
// check and the answers it renders — builds on it. Each public module is
// the file or folder of its name.
pub mod algorithm;
pub mod clock;
pub mod decision;
pub mod limiter;
pub mod lockout;
pub mod policy;
pub mod store;

pub mod body;
mod check;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config;
pub mod future;
pub mod grpc;
pub mod info;
pub mod inspect;
pub mod key;
mod layer;
pub mod meter;
pub mod mode;
pub mod outcome;
pub mod resolve;
pub mod response;
mod rule;
mod service;
mod settings;
pub mod upgrade;

#[cfg(test)]
mod floors;

// The front door: what a middleware or direct-API user writes. Everything
// else lives in its module.
pub use decision::Decision;
pub use info::RateLimitInfo;
pub use layer::ThrottleLayer;
pub use limiter::Limiter;
pub use mode::{FailMode, Mode};
pub use policy::{Policy, PolicyError};
pub use rule::{Rule, RuleError};
pub use service::Throttle;
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{MemoryStore, Store, StoreError};

/// The README's examples, compiled as doctests (they use every feature).
#[cfg(all(doctest, feature = "redis", feature = "axum"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
