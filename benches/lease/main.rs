//! Issue 26 item 3: one global fixed-window key hammered by 4 client
//! processes on one private `redis-server`, side by side in one run for
//! leasing off (a plain `RedisStore`), leasing on (`LeasingStore` over a
//! `RedisStore`, with and without prefetching the next block) and the
//! memory store (one per process: the physical limit in process, nothing
//! shared).
//!
//! ```text
//! GIT_COMMIT=$(git rev-parse --short HEAD) cargo bench --features redis --bench lease
//! BENCH_SECS=0.5 cargo bench --features redis --bench lease     # smoke run
//! ```
//!
//! The parent starts the server (`tests/support/redis.rs`), then for each
//! phase and configuration re-executes itself 4 times in child mode
//! (`LEASE_BENCH_CHILD=<config>:<phase>`, the URL in `LEASE_BENCH_URL`).
//! Each child connects, says `ready`, waits for `go` on stdin (so that
//! connecting is not measured), runs `BENCH_TASKS` tasks checking the key
//! for `BENCH_SECS` or `BENCH_MAX_CHECKS` checks, ends its leases
//! (`shutdown`, counted), and prints one `result …` line.
//!
//! Phases (the key is new in each cell; windows of 1 s):
//! * `open`: limit 2^40, unpaced — throughput of a hot key under its limit;
//! * `near`: limit `BENCH_LIMIT` (default 100,000/s), paced to
//!   `BENCH_DEMAND` (default 0.9) of it across the 4 processes — false
//!   denials (denied in a window that admitted fewer than the limit);
//! * `over`: limit `BENCH_OVER_LIMIT` (default 25,000/s, below what even
//!   leasing off serves), unpaced — no window admits more than the limit.
//!
//! An admission's window is derived from the decision: `now + reset_after`
//! (Unix clock) rounded to the nearest window end (the crate aligns fixed
//! windows to Unix time), and cross-checked against `charged_at_ns`. The
//! parent adds up the windows of the 4 children (memory store: per process,
//! its limit is not shared). Redis commands are the delta of every
//! command's `calls` in `INFO commandstats` less the parent's own `INFO`;
//! server CPU is the `used_cpu_user + used_cpu_sys` delta; both per
//! admitted check.
//!
//! Leasing settings for a hot global key: `hot_threshold(64)`,
//! `initial_block(64)`, `max_block(1024)` (`BENCH_MAX_BLOCK`),
//! `blocks_per_period(8)`, expiry margin 1 ms (the defaults but the first
//! block). 4 processes hold at most 4 × (1,024 + 256) = 5,120 units, 5% of
//! 100,000: a denial needs a window that admitted ≥ 94,880 (the
//! documented bound), and a full block costs one script per 1,024 checks.
//! With prefetching (the default), a key's next block is asked for when
//! its lease is down to a quarter; without it (`blocking`), only once the
//! lease is spent, and the key's checks in that process wait for the block.
//!
//! Other knobs: `BENCH_TASKS` (16), `BENCH_WORKERS` (tokio workers per
//! child, 1), `BENCH_PROCS` (4), `BENCH_PHASES` (`open,near,over`),
//! `BENCH_CONFIGS` (`off,lease,blocking,memory`), `BENCH_REPEAT` (1: each
//! cell this many times, the configurations in rotation, then a table of
//! each one's worst cell — highest p99, most commands per admission — so a
//! stall in one cell of many cannot hide in a median). Latency includes two `Instant`
//! reads; unpaced tasks yield every 256 checks.

#[path = "../common/lease_stats.rs"]
mod lease_stats;
#[path = "../../tests/support/redis.rs"]
mod redis_support;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use lease_stats::{cell, handshake, Tally, UnixClock, Verdict};
use redis_support::RedisServer;
use report::{print_table, print_worst, Row};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Charge, RedisStore};
use tower_throttle::{MemoryStore, Policy, Store};

const WINDOW: Duration = Duration::from_secs(1);
const OPEN_LIMIT: u64 = 1 << 40;
const CONFIGS: [(&str, &str); 4] = [
    ("off", "leasing off (RedisStore)"),
    ("lease", "leasing on (LeasingStore over RedisStore)"),
    ("blocking", "leasing on, no prefetch"),
    ("memory", "memory store (per process)"),
];

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn limit_of(phase: &str) -> u64 {
    match phase {
        "open" => OPEN_LIMIT,
        "over" => env("BENCH_OVER_LIMIT", 25_000),
        _ => env("BENCH_LIMIT", 100_000),
    }
}

fn main() {
    match std::env::var("LEASE_BENCH_CHILD") {
        Ok(spec) => child(&spec),
        Err(_) => parent(),
    }
}

// ---------------------------------------------------------------- child --

fn child(spec: &str) {
    let (config, phase) = spec.split_once(':').expect("config:phase");
    let url: String = env("LEASE_BENCH_URL", String::new());
    let index: u32 = env("LEASE_BENCH_INDEX", 0);
    let procs: u32 = env("BENCH_PROCS", 4);
    let tasks: u32 = env("BENCH_TASKS", 16);
    let secs: f64 = env("BENCH_SECS", 3.0);
    let max_checks: u64 = env("BENCH_MAX_CHECKS", 50_000_000);
    let limit = limit_of(phase);
    let policy = Policy::fixed_window(limit, WINDOW).unwrap();
    // Paced in `near`: every task of every process checks once per `gap`.
    let gap = (phase == "near").then(|| {
        let demand = env("BENCH_DEMAND", 0.9) * limit as f64;
        WINDOW.mul_f64(f64::from(procs * tasks) / demand)
    });
    let run = Run {
        policy,
        key: format!("global:{config}:{phase}").into_bytes().into(),
        tasks,
        per_task: max_checks / u64::from(tasks),
        secs,
        gap,
        offset: index,
        procs,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env("BENCH_WORKERS", 1usize).max(1))
        .enable_all()
        .build()
        .unwrap();
    let redis = || async {
        RedisStore::builder()
            .prefix("leasebench")
            .connect(url.as_str())
            .await
            .unwrap()
    };
    let tally = match config {
        "off" => {
            let store = Arc::new(rt.block_on(redis()));
            handshake();
            rt.block_on(run.drive(store))
        }
        "lease" | "blocking" => {
            let store = rt.block_on(async {
                LeasingStore::builder(redis().await)
                    .hot_threshold(64)
                    .initial_block(64)
                    .max_block(env("BENCH_MAX_BLOCK", 1024))
                    .blocks_per_period(8)
                    .prefetch(config == "lease")
                    .build()
                    .unwrap()
            });
            handshake();
            let store = Arc::new(store);
            rt.block_on(async {
                let tally = run.drive(store.clone()).await;
                store.shutdown().await.unwrap();
                tally
            })
        }
        "memory" => {
            handshake();
            rt.block_on(run.drive(Arc::new(MemoryStore::new())))
        }
        other => panic!("unknown configuration {other}"),
    };
    println!("{}", tally.to_line());
}

struct Run {
    policy: Policy,
    key: Arc<[u8]>,
    tasks: u32,
    per_task: u64,
    secs: f64,
    gap: Option<Duration>,
    offset: u32,
    procs: u32,
}

impl Run {
    async fn drive<S: Store + Send + Sync + 'static>(&self, store: Arc<S>) -> Tally {
        let clock = UnixClock::new();
        let start = Instant::now();
        let deadline = start + Duration::from_secs_f64(self.secs);
        let w = WINDOW.as_nanos() as u64;
        let handles: Vec<_> = (0..self.tasks)
            .map(|i| {
                let (store, key, policy) = (store.clone(), self.key.clone(), self.policy);
                let per_task = self.per_task;
                // Paced tasks start spread over one gap, across processes too.
                let mut pace = self.gap.map(|gap| {
                    let slot = self.offset * self.tasks + i;
                    let first = gap.mul_f64(f64::from(slot) / f64::from(self.procs * self.tasks));
                    tokio::time::interval_at((start + first).into(), gap)
                });
                tokio::spawn(async move {
                    let mut t = Tally::default();
                    for n in 0..per_task {
                        match pace.as_mut() {
                            Some(p) => {
                                p.tick().await;
                            }
                            None if n % 256 == 255 => tokio::task::yield_now().await,
                            None => {}
                        }
                        let t0 = Instant::now();
                        if t0 >= deadline {
                            break;
                        }
                        let answer = store.check(Charge::new(&key, &policy, 1)).await;
                        let t1 = Instant::now();
                        t.checks += 1;
                        t.hist.record(t1 - t0);
                        let Ok(d) = answer else {
                            t.errors += 1;
                            continue;
                        };
                        // The window ends at `now + reset_after`, rounded to a window end.
                        let end = clock.ns(t1) + d.reset_after.as_nanos() as u64;
                        let window = ((end + w / 2) / w).saturating_sub(1);
                        let slot = t.windows.entry(window).or_default();
                        if d.allowed {
                            t.admitted += 1;
                            slot.0 += 1;
                            t.late += u64::from(clock.ns(t0) >= (window + 1) * w);
                            t.mismatched += u64::from(d.charged_at_ns / w != window);
                        } else {
                            t.denied += 1;
                            slot.1 += 1;
                        }
                    }
                    t
                })
            })
            .collect();
        let mut total = Tally::default();
        for h in handles {
            total.absorb(&h.await.unwrap());
        }
        total.secs = start.elapsed().as_secs_f64();
        total
    }
}

// --------------------------------------------------------------- parent --

fn parent() {
    let phases: String = env("BENCH_PHASES", "open,near,over".to_string());
    let configs: String = env("BENCH_CONFIGS", "off,lease,blocking,memory".to_string());
    let server = RedisServer::start();
    let mut admin = server.conn();
    let mut rows = Vec::new();
    // Cells are repeated in rotation (every configuration once, then again),
    // so a stall that hits one cell in several is seen, not averaged away.
    let repeat: usize = env("BENCH_REPEAT", 1);
    for phase in phases.split(',').map(str::trim) {
        let cells = CONFIGS.iter().filter(|(c, _)| configs.contains(c));
        for &(config, name) in (0..repeat).flat_map(|_| cells.clone()) {
            let limit = limit_of(phase);
            let (tallies, calls, cpu) = cell(
                &server.url(),
                env("BENCH_PROCS", 4),
                &mut admin,
                config,
                phase,
            );
            let mut all = Tally::default();
            let mut verdict = Verdict::default();
            for t in &tallies {
                all.absorb(t);
                if config == "memory" {
                    verdict.add(&t.windows, limit);
                }
            }
            if config != "memory" {
                verdict.add(&all.windows, limit);
            }
            let rates: Vec<f64> = tallies.iter().map(|t| t.checks as f64 / t.secs).collect();
            eprintln!(
                "{phase:<5} {config:<6} checks {} admitted {} denied {} errors {} late {} window cross-check mismatches {} windows {:?}",
                all.checks, all.admitted, all.denied, all.errors, all.late, all.mismatched, all.windows
            );
            rows.push(Row {
                phase: phase.to_string(),
                name,
                config,
                limit,
                rates,
                all,
                verdict,
                server: (config != "memory").then_some((calls, cpu)),
            });
        }
    }
    print_table(&rows);
    if repeat > 1 {
        print_worst(&rows);
    }
}
