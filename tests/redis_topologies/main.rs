//! Redis Cluster, Sentinel and TLS, each on real servers.
//!
//! One test binary for the area (`cargo test --test redis_topologies`); each module
//! is one file of tests, and the shared helpers are mounted once below.
#![cfg(feature = "redis")]

#[cfg(feature = "tls")]
#[path = "../support/pki.rs"]
mod pki;
#[path = "../support/redis.rs"]
mod redis_support;

mod redis_cluster;
mod redis_sentinel;
#[cfg(feature = "tls")]
mod redis_tls;
