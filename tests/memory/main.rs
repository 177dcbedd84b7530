//! The memory store (and the governor-backed one): decisions, caps, sweeping.
//!
//! One test binary for the area (`cargo test --test memory`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[path = "../support/capture.rs"]
mod capture;
#[cfg(feature = "governor")]
mod governor_store;
mod memory_store;
