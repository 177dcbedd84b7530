//! The `metrics` feature's series.
//!
//! One test binary for the area (`cargo test --test metrics`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[cfg(feature = "metrics")]
mod metrics;
