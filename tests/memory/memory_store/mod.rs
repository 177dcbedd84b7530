//! The memory store's promises: redis-cell's literal replies, exact bounds
//! under concurrency, bounded memory, cold keys swept, clock faults.

use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::{MemoryStore, Policy};

mod bounds;
mod capacity;
mod clocks;
mod hot_keys;
mod limiter;

mod flood;
mod full;
mod hottest;

fn manual_store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn all_policies() -> Vec<(&'static str, Policy)> {
    let minute = Duration::from_secs(60);
    vec![
        ("cell", Policy::cell(14, 30, minute).unwrap()),
        ("funnel", Policy::funnel(15, 0.5).unwrap()),
        ("token_bucket", Policy::token_bucket(15, 0.5).unwrap()),
        ("sliding_log", Policy::sliding_log(15, minute).unwrap()),
        ("fixed_window", Policy::fixed_window(15, minute).unwrap()),
        (
            "sliding_window",
            Policy::sliding_window(15, minute).unwrap(),
        ),
        ("concurrency", Policy::concurrency(15).unwrap()),
    ]
}
