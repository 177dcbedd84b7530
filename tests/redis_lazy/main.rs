//! A Redis store connected in the background (`connect_lazy`, on one
//! server, a cluster or behind Sentinel), with what it logs.
//!
//! One test binary for the area (`cargo test --test redis_lazy`); each module
//! is one file of tests, and the shared helpers are mounted once below.
#![cfg(feature = "redis")]

#[path = "../support/capture.rs"]
mod capture;
#[path = "../support/redis.rs"]
mod redis_support;
#[path = "../support/sentinel.rs"]
mod sentinel;

mod redis_lazy;
mod redis_lazy_topologies;
