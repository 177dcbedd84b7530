//! Exactness under concurrency: many callers on one key admit exactly what
//! the reference model (tests/models) admits for the elapsed time, never more.
//!
//! Time moves in phases: every caller checks at a frozen instant, then one
//! thread advances the manual clock by the next step of a fixed schedule
//! (nanoseconds to several windows). Within a phase the key is saturated
//! (800 checks against a limit of 20), so the count admitted per phase is a
//! fact of the algorithm, not of the interleaving, and must equal the model's
//! greedy count at that instant, phase by phase.
//!
//! Also: a free-running clock (no phases) never admits more than the model
//! over the same schedule; all-or-nothing multi-rule checks under
//! concurrency charge exactly the admitted requests; clocks that jump back or
//! stall through the `Limiter` and the `ThrottleLayer`. With the `redis`
//! feature, the same phases on Redis and on a Redis Cluster from 4 store
//! instances (4 app instances) × 8 tasks.
//!
//! Clock faults directly on the memory store are in tests/memory/memory_store/clocks.rs
//! (`clock_jumping_backwards_never_admits_more`, `stalled_clock_admits_only_the_burst`,
//! `huge_costs_and_extreme_times_do_not_panic`); skewed app clocks on Redis in
//! tests/redis/redis_store/instances.rs (`skewed_app_clocks_are_irrelevant_with_server_time`).

use crate::models;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use models::Model;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

mod phases;
#[cfg(feature = "redis")]
mod redis_exactness;
mod time;

const THREADS: usize = 8;
const PER_THREAD: usize = 10_000;
const PHASES: usize = 100;
const PER_PHASE: usize = PER_THREAD / PHASES;
const LIMIT: u64 = 20;

/// Every algorithm with a limit of 20 over about a second (whole µs, so the
/// same policies run on Redis).
fn policies() -> Vec<(&'static str, Policy)> {
    let s = Duration::from_secs(1);
    vec![
        ("cell", Policy::cell(LIMIT - 1, LIMIT, s).unwrap()),
        ("funnel", Policy::funnel(LIMIT, 16.0).unwrap()),
        ("token_bucket", Policy::token_bucket(LIMIT, 40.0).unwrap()),
        ("sliding_log", Policy::sliding_log(LIMIT, s).unwrap()),
        ("fixed_window", Policy::fixed_window(LIMIT, s).unwrap()),
        ("sliding_window", Policy::sliding_window(LIMIT, s).unwrap()),
        (
            "concurrency",
            Policy::concurrency_with_lease(LIMIT, s).unwrap(),
        ),
    ]
}

/// A fixed pseudo-random schedule of clock steps (whole µs): none, tiny,
/// fractions of an emission interval, about a window, several windows.
fn schedule(phases: usize) -> Vec<Duration> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    (0..phases)
        .map(|_| {
            Duration::from_micros(match next(6) {
                0 => 0,
                1 => 1 + next(1_000),
                2 => 10_000 + next(40_000),
                3 => 50_000 + next(200_000),
                4 => 900_000 + next(200_000),
                _ => 1_000_000 + next(2_500_000),
            })
        })
        .collect()
}

fn manual_store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

/// What the model admits in each phase, checking greedily (cost 1) until
/// denied at each instant of the schedule.
fn model_per_phase(
    policy: &Policy,
    start_ns: u64,
    steps: &[Duration],
    per_phase: usize,
) -> Vec<u64> {
    let mut model = Model::default();
    let mut now = start_ns;
    let mut permit = 0;
    steps
        .iter()
        .map(|step| {
            let mut admitted = 0;
            for _ in 0..per_phase {
                permit += 1;
                if !model.check(b"hot", policy, now, 1, permit).allowed {
                    break;
                }
                admitted += 1;
            }
            now += step.as_nanos() as u64;
            admitted
        })
        .collect()
}
