//! A flood of new keys against a full memory store: what new clients are
//! refused, what the flood is given over its limit, and what each flood
//! request costs, for three store settings side by side.
//!
//! ```sh
//! GIT_COMMIT=$(git rev-parse --short HEAD) cargo bench --bench flood
//! ```
//!
//! Knobs: `BENCH_K` (the cap, default 10,000), `BENCH_NEW` (new clients,
//! default 1,000).
//!
//! For a 5/min sliding log and a 5/min fixed window, a store capped at K keys
//! takes N distinct flood keys (N = 0.5K, 1.2K, 2K, 10K and 100K), one
//! request each, six each (one over the limit) or twenty each (four times
//! the limit), in rounds over all the keys, so a key's requests are as far
//! apart as the flood allows; then 1,000 brand-new clients send one request
//! each. The clock is a `ManualClock` that never
//! moves: every request falls in one window, so a client is never owed more
//! than the limit, and every refusal of a client that was admitted fewer
//! than 5 times is wrong.
//!
//! The settings:
//!
//! - **old**: `evict_when_full(false).overflow_buckets(1)`, the behaviour
//!   before shared counters: every new key beyond the cap on one counter
//!   per rule.
//! - **default**: the builder's defaults: no eviction, new keys beyond the
//!   cap on one of 1,024 counters picked by key hash.
//! - **evict**: `evict_when_full(true)`: eviction of the least used key of
//!   a sample (the fewest units used), then the default 1,024 counters.
//!
//! Columns: new clients refused (wrongly, each having sent nothing before);
//! flood requests refused while their key had been admitted fewer than 5
//! times (wrongly too); the worst over-admission, max over keys of
//! (admitted − 5); the total, Σ max(0, admitted − 5); the store's
//! `evicted_keys()` and `overflowed_checks()` after the flood (before the
//! new clients); and the
//! flood's wall time per request (one thread, key bytes prepared before).
//! The frozen clock means a full namespace rescans the other shards for
//! keys at rest once per cell, not once a second: the figure leaves out
//! that rescan (a walk of every shard's expiry, at most once a second).

use std::hint::black_box;
use std::time::{Duration, Instant};

use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

const LIMIT: u64 = 5;
const WINDOW: Duration = Duration::from_secs(60);
/// N as multiples of K, in tenths.
const FLOODS: [(usize, &str); 5] = [
    (5, "0.5K"),
    (12, "1.2K"),
    (20, "2K"),
    (100, "10K"),
    (1_000, "100K"),
];
/// Requests per flood key: one, one over the limit, four times the limit.
const ROUNDS: [u32; 3] = [1, 6, 20];
/// The width of a key, so all keys lie in one buffer.
const KEY_LEN: usize = 16;

#[derive(Clone, Copy)]
enum Setting {
    Old,
    Default,
    Evict,
}

impl Setting {
    const ALL: [Setting; 3] = [Setting::Old, Setting::Default, Setting::Evict];

    fn store(self, clock: ManualClock, k: usize) -> MemoryStore<ManualClock> {
        let b = MemoryStore::builder().clock(clock).max_keys(k);
        match self {
            Setting::Old => b.evict_when_full(false).overflow_buckets(1),
            Setting::Default => b,
            Setting::Evict => b.evict_when_full(true),
        }
        .build()
    }
}

/// `n` keys of `KEY_LEN` bytes each, `prefix` then the index, in one buffer.
fn keys(prefix: &str, n: usize) -> Vec<u8> {
    let mut all = Vec::with_capacity(n * KEY_LEN);
    for i in 0..n {
        let key = format!("{prefix}{i:0w$}", w = KEY_LEN - prefix.len());
        assert_eq!(key.len(), KEY_LEN);
        all.extend_from_slice(key.as_bytes());
    }
    all
}

fn key(all: &[u8], i: usize) -> &[u8] {
    &all[i * KEY_LEN..(i + 1) * KEY_LEN]
}

struct Cell {
    new_refused: usize,
    flood_requests: u64,
    flood_wrongly_refused: u64,
    max_over: u64,
    total_over: u64,
    evicted: u64,
    overflowed: u64,
    ns_per_flood_request: f64,
}

fn run(setting: Setting, policy: &Policy, k: usize, n: usize, rounds: u32, new: usize) -> Cell {
    let store = setting.store(ManualClock::new(), k);
    let flood = keys("flood:", n);
    let fresh = keys("new:", new);
    let mut admitted = vec![0u64; n];
    let mut wrong = 0u64;
    let start = Instant::now();
    for _ in 0..rounds {
        for (i, count) in admitted.iter_mut().enumerate() {
            let d = store
                .check_sync(Charge::new(key(&flood, i), policy, 1))
                .expect("a memory store decides");
            if d.allowed {
                *count += 1;
            } else if *count < LIMIT {
                wrong += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    let flood_requests = n as u64 * u64::from(rounds);
    let (evicted, overflowed) = (store.evicted_keys(), store.overflowed_checks());
    let mut new_refused = 0;
    for i in 0..new {
        let d = store
            .check_sync(Charge::new(key(&fresh, i), policy, 1))
            .expect("a memory store decides");
        new_refused += usize::from(!black_box(d.allowed));
    }
    let over = admitted.iter().map(|a| a.saturating_sub(LIMIT));
    Cell {
        new_refused,
        flood_requests,
        flood_wrongly_refused: wrong,
        max_over: over.clone().max().unwrap_or(0),
        total_over: over.sum(),
        evicted,
        overflowed,
        ns_per_flood_request: elapsed.as_nanos() as f64 / flood_requests as f64,
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| "(unknown CPU)".into())
}

fn commit() -> String {
    std::env::var("GIT_COMMIT").unwrap_or_else(|_| {
        std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "(GIT_COMMIT unset)".into())
    })
}

/// `n` with thousands separators.
fn num(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn percent(part: u64, all: u64) -> String {
    let p = part as f64 * 100.0 / all.max(1) as f64;
    if p == 0.0 {
        "0".into()
    } else {
        format!("{p:.1}%")
    }
}

/// One cell of each setting, `old / default / evict`.
fn three(cells: &[Cell], f: impl Fn(&Cell) -> String) -> String {
    cells.iter().map(f).collect::<Vec<_>>().join(" / ")
}

fn main() {
    // `cargo bench` passes `--bench`; there is no filter.
    let k = env("BENCH_K", 10_000);
    let new = env("BENCH_NEW", 1_000);
    println!(
        "commit {}; CPU {}; cap K = {} keys, limit {LIMIT} per {} s, {} new clients one request each, clock frozen; each cell old / default / evict",
        commit(),
        cpu_model(),
        num(k as u64),
        WINDOW.as_secs(),
        num(new as u64),
    );
    let policies = [
        ("sliding log", Policy::sliding_log(LIMIT, WINDOW).unwrap()),
        ("fixed window", Policy::fixed_window(LIMIT, WINDOW).unwrap()),
    ];
    for (name, policy) in &policies {
        println!("\n{name}, {LIMIT}/min:\n");
        println!("| N × requests | new clients refused | flood requests refused within their limit | max over | Σ over | evicted | overflowed | ns per flood request |");
        println!("|---|---|---|---|---|---|---|---|");
        for rounds in ROUNDS {
            for (tenths, label) in FLOODS {
                let n = k * tenths / 10;
                let cells: Vec<Cell> = Setting::ALL
                    .iter()
                    .map(|&setting| run(setting, policy, k, n, rounds, new))
                    .collect();
                println!(
                    "| {label} = {} × {rounds} | {} | {} | {} | {} | {} | {} | {} |",
                    num(n as u64),
                    three(&cells, |c| percent(c.new_refused as u64, new as u64)),
                    three(&cells, |c| percent(
                        c.flood_wrongly_refused,
                        c.flood_requests
                    )),
                    three(&cells, |c| num(c.max_over)),
                    three(&cells, |c| num(c.total_over)),
                    three(&cells, |c| num(c.evicted)),
                    three(&cells, |c| num(c.overflowed)),
                    three(&cells, |c| format!("{:.0}", c.ns_per_flood_request)),
                );
            }
        }
    }
}
