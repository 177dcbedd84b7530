//! Every store against the reference models: conformance, exactness, receipts.
//!
//! One test binary for the area (`cargo test --test conformance`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[cfg(all(feature = "conformance", feature = "redis"))]
#[path = "../support/faults.rs"]
mod faults;
#[cfg(feature = "conformance")]
#[path = "../models/mod.rs"]
mod models;
#[cfg(feature = "redis")]
#[path = "../support/redis.rs"]
mod redis_support;

#[cfg(feature = "conformance")]
mod conformance;
#[cfg(feature = "redis")]
mod estimates;
#[cfg(feature = "conformance")]
mod exactness;
#[cfg(feature = "conformance")]
mod model_equivalence;
#[cfg(feature = "redis")]
mod receipts;
#[cfg(feature = "conformance")]
mod stale_readings;
