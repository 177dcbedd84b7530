//! The Redis store on a real `redis-server`: scripts, batches, faults, fallback.
//!
//! One test binary for the area (`cargo test --test redis`); each module
//! is one file of tests, and the shared helpers are mounted once below.
#![cfg(feature = "redis")]

#[path = "../support/counting_store.rs"]
mod counting_store;
#[path = "../support/decided_by.rs"]
mod decided_by;
#[path = "../support/faults.rs"]
mod faults;
#[path = "../support/peek.rs"]
mod peek;
#[macro_use]
#[path = "../support/model_bench.rs"]
mod model_bench;
#[path = "../support/redis.rs"]
mod redis_support;

mod answers;
mod composed;
mod redis_batches;
mod redis_cancellation;
mod redis_connect;
mod redis_fallback;
mod redis_faults;
mod redis_fixed_forms;
mod redis_foreign;
mod redis_gcra_ns;
mod redis_lease;
mod redis_ns_windows;
mod redis_soak;
mod redis_store;
mod redis_windows_exact;
