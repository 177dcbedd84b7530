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
//!     assert!(replies.check("laoqian:reply").await?.allowed);
//! }
//! let sixth = replies.check("laoqian:reply").await?;
//! assert!(!sixth.allowed);
//! assert!(sixth.retry_after.unwrap() <= Duration::from_secs(60));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
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

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod algorithm;
pub mod clock;
mod decision;
mod limiter;
mod policy;
pub mod store;

pub use decision::{Decision, PermitId};
pub use limiter::{Limiter, Permit};
pub use policy::{
    Algorithm, ConcurrencyParams, GcraParams, Policy, PolicyError, WindowParams, DEFAULT_LEASE,
};
#[cfg(feature = "redis")]
pub use store::{CellStore, RedisClusterStore, RedisStore};
pub use store::{MemoryStore, Rule, Store, StoreError};

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
