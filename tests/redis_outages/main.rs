//! Redis refusing work (OOM, BUSY, LOADING, READONLY, MISCONF, NOREPLICAS,
//! maxclients, credentials changed, …), with what is logged.
//!
//! One test binary for the area (`cargo test --test redis_outages`); each module
//! is one file of tests, and the shared helpers are mounted once below.
#![cfg(feature = "redis")]

#[path = "../support/capture.rs"]
mod capture;
#[path = "../support/decided_by.rs"]
mod decided_by;
#[path = "../support/outages.rs"]
mod outages;
#[path = "../support/redis.rs"]
mod redis_support;

mod redis_outages;
mod redis_refusals;
