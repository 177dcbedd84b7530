//! The Redis store against a private `redis-server`: decision-by-decision
//! agreement with the memory store, all-or-nothing rules, TTLs, server time,
//! several app instances, reconnects, hostile keys and typed errors.

use crate::model_bench;
use crate::redis_support;

use std::time::Duration;

use redis_support::RedisServer;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::{Decision, MemoryStore, Policy};

mod batching;
mod cell;
mod deny_cache;
mod failures;
mod instances;
mod keys;
mod models;

/// A store on `clock`; TTLs padded so that real time passing faster than
/// the frozen test clock never expires state the model still holds.
async fn client_store(url: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("t")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .connect(url)
        .await
        .unwrap()
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn no_permit(d: Decision) -> Decision {
    model_bench::strip_permit(d)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn five(n: u64) -> Vec<Policy> {
    let w = Duration::from_secs(10);
    vec![
        Policy::cell(n - 1, 1, w).unwrap(),
        Policy::sliding_log(n, w).unwrap(),
        Policy::fixed_window(n, w).unwrap(),
        Policy::sliding_window(n, w).unwrap(),
        Policy::concurrency_with_lease(n, w).unwrap(),
    ]
}

fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}
