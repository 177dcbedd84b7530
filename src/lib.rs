//! Exact rate limiting for [tower] services (axum, hyper, tonic) and for
//! plain code.
//!
//! Each limit is a [`Policy`] (GCRA, a sliding log, a fixed or sliding
//! window, a concurrency cap), counted in a [`Store`]: in memory, or in Redis
//! when several instances of an app share limits. Every check answers a
//! [`Decision`] shaped like redis-cell's `CL.THROTTLE` reply. The words of
//! art are defined in the [glossary](#glossary) at the end of this page.
//!
//! # A layer on a route
//!
//! [`ThrottleLayer`] is tower middleware for any `Service<http::Request<B>>`.
//! Each [`Rule`] pairs a policy with a [`key`] extractor and a cost. A denied
//! request gets a `429` with `Retry-After` and the IETF `RateLimit-Policy` /
//! `RateLimit` fields, and never reaches the inner service; a denied gRPC
//! call gets `RESOURCE_EXHAUSTED` with a retry delay instead ([`grpc`]).
//! [`Mode`] delays or dry-runs instead of rejecting, [`FailMode`] decides
//! what a store failure does, and [`RateLimitInfo`] is what handlers can read.
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
//! (one server, Sentinel, or a cluster; `rediss://` with `tls`): each check
//! is one atomic script on the server's clock ([`store::redis`]). Wrapped in
//! a [`FallbackStore`](store::FallbackStore) with a [`MemoryStore`], each
//! instance limits in memory while Redis is down instead of answering 503 or
//! letting everything through. Each switch is logged as a `tracing` warning,
//! seen only where the app installs a subscriber;
//! [`RateLimitInfo::decided_by`] says which store decided. For one key that
//! every instance checks thousands of times a second,
//! [`LeasingStore`](store::lease::LeasingStore) spends blocks of it in process.
//!
//! ```no_run
//! # #[cfg(feature = "redis")]
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tower_throttle::store::FallbackStore;
//! use tower_throttle::{key::BearerToken, MemoryStore, Policy, RedisStore, ThrottleLayer};
//!
//! // Connects in the background (call it inside the Tokio runtime).
//! let store = RedisStore::builder()
//!     .prefix("myapp")
//!     .timeout(Duration::from_millis(50))
//!     .connect_lazy("redis://127.0.0.1:6379")?;
//! let store = FallbackStore::new(store, MemoryStore::new());
//! let posts = ThrottleLayer::new(store, Policy::cell(15, 30, Duration::from_secs(3600))?)
//!     .key(BearerToken)
//!     .prefix("post");
//! # let _ = posts;
//! # Ok(())
//! # }
//! ```
//!
//! # Limits in a file, and a client's state
//!
//! With the `config` feature a service's limits live in one YAML, TOML or
//! JSON file, checked before traffic and reloaded while serving:
//! [`config::RuleTable`] hands out each route's layer. `peek` reads a key's
//! state under every rule without charging it
//! ([`ThrottleLayer::peek`], [`ThrottleLayer::peek_request`] by what the app
//! knows of a client, [`inspect`]), and `reset` forgets it.
//!
//! ```no_run
//! # #[cfg(feature = "config")]
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use tower_throttle::{config::RuleTable, inspect::Client, MemoryStore};
//!
//! // limits.yaml:
//! //   routes:
//! //     reply:
//! //       key: bearer_token
//! //       rules: [{ name: per-minute, policy: { sliding_log: { limit: 5, window: 60s } } }]
//! let table = RuleTable::from_path(MemoryStore::new(), "limits.yaml")?;
//! let _watch = table.watch("limits.yaml"); // reloads on change and on SIGHUP
//! let reply = table.layer("reply")?; // a tower layer: `.route_layer(reply)`
//! let state = table.current("reply").unwrap().peek_request(&Client::bearer("token")).await?;
//! # let _ = (reply, state);
//! # Ok(())
//! # }
//! ```
//!
//! # Costs known after the response
//!
//! An LLM API charges tokens, a download bytes: [`Rule::settle_cost`] with
//! [`meter::ActualCost`] charges an estimate at admission and settles the
//! actual cost from the response (a [`meter::ReportedCost`] extension, the
//! bytes sent, or a trailer), through the charge's receipt.
//!
//! # Without HTTP
//!
//! A [`Limiter`] checks keys in plain code (`check`, `peek`, `reset`,
//! `wait`, `acquire`), with several rules and a lock-out if asked.
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
//! # Examples
//!
//! In the repository's `examples/` (`cargo run --example <name>`):
//! `examples/ugc.rs` (an axum API with every algorithm and tiers; Redis with
//! a memory fallback when `REDIS_URL` is set), `examples/tower_service.rs`
//! (plain hyper), `examples/grpc.rs` (tonic), `examples/llm_tokens.rs`
//! (metering in tokens), `examples/admin.rs` (`peek` and the hottest keys
//! served as JSON), `examples/is_action_allowed.rs` (plain code).
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
//! # Glossary
//!
//! - **GCRA**: the Generic Cell Rate Algorithm: a rate with a burst, kept as
//!   one instant per key, its *theoretical arrival time* (`tat` in the code;
//!   also called its *frontier*): when its admitted units are all paid off.
//!   A unit's *slot* is its place in that line, one per `period / count`.
//! - **cell**: redis-cell's name for a GCRA limiter ([`Policy::cell`] takes
//!   its arguments). **funnel** (leaky bucket) and **token bucket**: GCRA
//!   seen as a bucket that leaks, or refills, at a steady rate.
//! - **fixed window**: a count per aligned window; **sliding window**: this
//!   window's count plus the last one's, weighted by overlap; **sliding
//!   log**: every admission's instant, an exact count.
//! - **charge**: a key, a policy and a cost, what one store call takes; its
//!   **receipt** says where the units went, so a refund goes back there.
//! - **settle**: charge a request's actual cost once the response shows it
//!   ([`meter`]); the check's last stage also applies the mode.
//! - **lease**: a block of a hot key's units a
//!   [`LeasingStore`](store::lease::LeasingStore) spends in process; also a
//!   concurrency permit's time limit.
//! - **tombstone**: the Redis marker of a permit released for a caller that
//!   left, so a late check cannot take it back.
//! - **lock-out**: refusing a key for a while after N denials (*strikes*):
//!   [`lockout::Penalty`].
//! - **namespace**: the `prefix:rule:` a layer's keys start with; two layers
//!   share one only on purpose.
//! - **fallback**: the store a [`FallbackStore`](store::FallbackStore) asks
//!   while its primary is unavailable (an **outage**).
//! - **shared counter**: where a full [`MemoryStore`] counts the new keys it
//!   has no room for.
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
