//! A flood of new `user` descriptor values against throttle-rls on its
//! memory store at its cap (`RLS_MEMORY_MAX_KEYS=1000`): what brand-new
//! users are refused, what the flood is given over its limit, whether users
//! who spent their limit get it back, and what each flood request costs,
//! for three memory-store settings side by side.
//!
//! ```sh
//! GIT_COMMIT=$(git rev-parse --short HEAD) cargo run --release -p tower-throttle-rls --example rls_flood
//! ```
//!
//! The service is the one the binary runs (`server::start`, its table
//! loaded from a config directory, time on a frozen manual clock), called
//! in process through `RateLimiter::should_rate_limit`: no gRPC, so the
//! time per request is the service's and the store's, not the network's.
//! Rules: `user`, 5 per minute, with upstream's fixed window (the default:
//! a counter that counts every hit, refused ones too) and with the
//! `sliding_log` extension.
//!
//! Per cell: 100 users spend their limit first (6 requests: 5 OK, 1
//! OVER_LIMIT); N distinct flood users (1,200 and 10,000) send 1, 6 or 20
//! requests each, in rounds over all of them; then 100 brand-new users send
//! one request each; then each spender asks once more, which must be
//! OVER_LIMIT (its window has not moved).
//!
//! The settings: **old**, `evict_when_full(false).overflow_buckets(1)` (one
//! counter for every new key beyond the cap); **default**, the store
//! `RLS_MEMORY_MAX_KEYS` builds (the builder's defaults: no eviction, 1,024
//! counters picked by key hash); **evict**, `evict_when_full(true)`
//! (eviction of the least used key of a sample, then the default counters).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use throttle_rls::backend::{DynClock, TestHooks};
use throttle_rls::server::Running;
use throttle_rls::settings::Settings;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::BoxStore;
use tower_throttle::MemoryStore;

/// `RLS_MEMORY_MAX_KEYS`.
const K: usize = 1_000;
const LIMIT: u64 = 5;
const FLOODS: [usize; 2] = [1_200, 10_000];
const ROUNDS: [u32; 3] = [1, 6, 20];
const NEW: usize = 100;
const SPENDERS: usize = 100;
/// A day-aligned instant, so the minute window does not start mid-run.
const T0_NS: u64 = 86_400 * 19_675 * 1_000_000_000;

#[derive(Clone, Copy)]
enum Setting {
    Old,
    Default,
    Evict,
}

const SETTINGS: [Setting; 3] = [Setting::Old, Setting::Default, Setting::Evict];

struct Cell {
    new_refused: usize,
    flood_requests: u64,
    flood_wrongly_refused: u64,
    max_over: u64,
    total_over: u64,
    spenders_readmitted: usize,
    evicted: u64,
    overflowed: u64,
    us_per_flood_request: f64,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A config directory with one rule, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(rule: &str) -> Dir {
        let root = std::env::temp_dir().join(format!(
            "rls-flood-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(root.join("config")).unwrap();
        let yaml = format!(
            "domain: flood\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: {LIMIT}{rule}}}\n"
        );
        std::fs::write(root.join("config/flood.yaml"), yaml).unwrap();
        Dir(root)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn settings(dir: &Dir) -> Settings {
    let root = dir.0.to_str().unwrap().to_owned();
    Settings::from_lookup(&move |name| {
        Some(match name {
            "RUNTIME_ROOT" => root.clone(),
            "RUNTIME_WATCH_ROOT" => "false".into(),
            "RLS_RELOAD_INTERVAL" => "1h".into(),
            "GRPC_HOST" | "HOST" | "DEBUG_HOST" => "127.0.0.1".into(),
            "GRPC_PORT" | "PORT" | "DEBUG_PORT" => "0".into(),
            "RLS_MEMORY_MAX_KEYS" => K.to_string(),
            // Statsd is on by default, as upstream; nothing listens here.
            "USE_STATSD" => "false".into(),
            _ => return None,
        })
    })
    .unwrap()
}

/// The service and its memory store: the one the settings build
/// (default), or one built the same way with the setting's knobs.
async fn start(setting: Setting, dir: &Dir) -> (Running, MemoryStore<DynClock>) {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::starting_at(T0_NS));
    let own = |evict: bool, buckets: Option<usize>| {
        let b = MemoryStore::builder()
            .clock(DynClock(clock.clone()))
            .max_keys(K)
            .evict_when_full(evict);
        match buckets {
            Some(n) => b.overflow_buckets(n),
            None => b,
        }
        .build()
    };
    let store = match setting {
        Setting::Old => Some(own(false, Some(1))),
        Setting::Default => None,
        Setting::Evict => Some(own(true, None)),
    };
    let hooks = TestHooks {
        clock: Some(clock.clone()),
        store: store.clone().map(BoxStore::new),
    };
    let running = throttle_rls::server::start(&settings(dir), hooks)
        .await
        .expect("the service starts");
    let memory = store
        .or_else(|| running.memory.clone())
        .expect("a memory store");
    (running, memory)
}

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "flood".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Whether `user`'s request was allowed.
async fn ask(running: &Running, user: &str) -> bool {
    let r = running
        .limiter
        .should_rate_limit(request(user))
        .await
        .expect("an answer");
    r.overall_code == Code::Ok as i32
}

async fn run(setting: Setting, rule: &str, n: usize, rounds: u32) -> Cell {
    let dir = Dir::new(rule);
    let (running, memory) = start(setting, &dir).await;
    for s in 0..SPENDERS {
        let user = format!("spender{s}");
        for i in 0..=LIMIT {
            assert_eq!(
                ask(&running, &user).await,
                i < LIMIT,
                "a spender's own window"
            );
        }
    }
    let users: Vec<String> = (0..n).map(|i| format!("u{i}")).collect();
    let mut admitted = vec![0u64; n];
    let mut wrong = 0u64;
    let start = Instant::now();
    for _ in 0..rounds {
        for (user, count) in users.iter().zip(admitted.iter_mut()) {
            if ask(&running, user).await {
                *count += 1;
            } else if *count < LIMIT {
                wrong += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    let flood_requests = n as u64 * u64::from(rounds);
    let (evicted, overflowed) = (memory.evicted_keys(), memory.overflowed_checks());
    let mut new_refused = 0;
    for i in 0..NEW {
        new_refused += usize::from(!ask(&running, &format!("new{i}")).await);
    }
    let mut spenders_readmitted = 0;
    for s in 0..SPENDERS {
        spenders_readmitted += usize::from(ask(&running, &format!("spender{s}")).await);
    }
    running.shutdown();
    running.wait().await;
    let over = admitted.iter().map(|a| a.saturating_sub(LIMIT));
    Cell {
        new_refused,
        flood_requests,
        flood_wrongly_refused: wrong,
        max_over: over.clone().max().unwrap_or(0),
        total_over: over.sum(),
        spenders_readmitted,
        evicted,
        overflowed,
        us_per_flood_request: elapsed.as_nanos() as f64 / 1_000.0 / flood_requests as f64,
    }
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "commit {}; CPU {}; throttle-rls in process, RLS_MEMORY_MAX_KEYS={K}, user: {LIMIT}/minute, {SPENDERS} spenders, {NEW} new users one request each, clock frozen; each cell old / default / evict",
        commit(),
        cpu_model(),
    );
    let rules = [
        ("fixed window (upstream's counting, the default)", ""),
        ("sliding_log (extension)", ", algorithm: sliding_log"),
    ];
    rt.block_on(async {
        for (name, rule) in rules {
            println!("\n{name}:\n");
            println!("| N × requests | new users refused | flood requests refused within their limit | max over | Σ over | spenders admitted again | evicted | overflowed | µs per flood request |");
            println!("|---|---|---|---|---|---|---|---|---|");
            for rounds in ROUNDS {
                for n in FLOODS {
                    let mut cells = Vec::new();
                    for setting in SETTINGS {
                        cells.push(run(setting, rule, n, rounds).await);
                    }
                    println!(
                        "| {} × {rounds} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        num(n as u64),
                        three(&cells, |c| percent(c.new_refused as u64, NEW as u64)),
                        three(&cells, |c| percent(c.flood_wrongly_refused, c.flood_requests)),
                        three(&cells, |c| num(c.max_over)),
                        three(&cells, |c| num(c.total_over)),
                        three(&cells, |c| c.spenders_readmitted.to_string()),
                        three(&cells, |c| num(c.evicted)),
                        three(&cells, |c| num(c.overflowed)),
                        three(&cells, |c| format!("{:.2}", c.us_per_flood_request)),
                    );
                }
            }
        }
    });
}
