//! throttle-rls side by side with its real peers, envoyproxy/ratelimit and
//! limitador-server, each started here as a process on free loopback ports
//! with equivalent limits, driven over gRPC (`ShouldRateLimit`) by one
//! client.
//!
//! ```text
//! cargo build --release -p tower-throttle-rls --bin throttle-rls --example rls_peers
//! RLS_PEER_UPSTREAM=/path/to/ratelimit RLS_PEER_LIMITADOR=/path/to/limitador-server \
//!   target/release/examples/rls_peers [bench|exact|migrate|compare]
//! ```
//!
//! - `bench` (default): requests/s, p50 and p99 at 64 calls in flight, one
//!   hot key and 10,000 keys, on Redis (all three) and in memory
//!   (throttle-rls and limitador), in paired rounds (`PEERS_ROUNDS`,
//!   default 7, at most 100, of `PEERS_SECS`, default 2, at most 60, per
//!   server; at most 2,000,000 calls per server and round).
//! - `exact`: 4 instances of each server on one Redis, one key limited to
//!   500 a minute, 2,000 calls at once: admitted ÷ limit.
//! - `migrate`: 2 upstream pods and 2 throttle-rls pods on one Redis.
//! - `compare`: the same requests to upstream and to throttle-rls, each on
//!   a Redis of its own; prints every difference in the answers.
//!
//! A peer whose variable is unset is skipped, with a line saying so.
//! `RLS_BIN` overrides the throttle-rls binary.

mod compare;
mod exact;
mod load;
mod procs;

use std::process::ExitCode;
use std::sync::Arc;

use load::{header, paired, report, user, Contender, MakeRequest, Rounds};
use procs::{Bins, Kind, Limit, Redis, Server, Store};

/// Distinct values of the many-key runs.
const KEYS: u64 = 10_000;

fn env_num(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .unwrap_or(default)
}

/// The 1, 5 and 15 minute load averages.
pub fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

async fn contenders(servers: &[Server]) -> Result<Vec<Contender>, String> {
    let mut all = Vec::new();
    for s in servers {
        all.push(Contender {
            name: s.kind.name().to_owned(),
            client: load::connect(s.addr).await?,
            samples: Vec::new(),
        });
    }
    Ok(all)
}

async fn start_all(bins: &Bins, kinds: &[Kind], store: Store<'_>) -> Result<Vec<Server>, String> {
    // A limit no run reaches: every answer is OK.
    let limit = Limit {
        per: 4_000_000_000,
        unit: "minute",
    };
    let mut servers = Vec::new();
    for &kind in kinds {
        if bins.get(kind).is_some() {
            servers.push(Server::start(bins, kind, store, &limit, &[]).await?);
        }
    }
    Ok(servers)
}

async fn bench(bins: &Bins) -> Result<(), String> {
    let rounds = Rounds {
        rounds: env_num("PEERS_ROUNDS", 7.0).min(100.0) as usize,
        secs: env_num("PEERS_SECS", 2.0).min(60.0),
        cap: 2_000_000,
    };
    let hot: MakeRequest = Arc::new(|_| user("hot".into()));
    let many: MakeRequest = Arc::new(|i| user(format!("u{}", i % KEYS)));
    println!(
        "{} rounds of {} s per server, {} calls in flight on one connection; load average {}",
        rounds.rounds,
        rounds.secs,
        load::IN_FLIGHT,
        loadavg()
    );
    header();
    let redis = Redis::start()?;
    let servers = start_all(
        bins,
        &[Kind::Ours, Kind::Upstream, Kind::Limitador],
        Store::Redis(&redis),
    )
    .await?;
    for (name, make) in [("Redis, one hot key", &hot), ("Redis, 10,000 keys", &many)] {
        let mut all = contenders(&servers).await?;
        paired(&mut all, &rounds, make).await;
        report(name, &all);
    }
    drop(servers);
    let servers = start_all(bins, &[Kind::Ours, Kind::Limitador], Store::Memory).await?;
    for (name, make) in [
        ("memory, one hot key", &hot),
        ("memory, 10,000 keys", &many),
    ] {
        let mut all = contenders(&servers).await?;
        paired(&mut all, &rounds, make).await;
        report(name, &all);
    }
    println!("load average after: {}", loadavg());
    Ok(())
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "bench".into());
    let bins = match Bins::from_env() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rls_peers: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let run = rt.block_on(async {
        match mode.as_str() {
            "bench" => bench(&bins).await,
            "exact" => exact::exactness(&bins).await,
            "migrate" => exact::migrate(&bins).await,
            "compare" => compare::compare(&bins).await,
            other => Err(format!(
                "unknown mode {other:?}: bench, exact, migrate or compare"
            )),
        }
    });
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rls_peers: {e}");
            ExitCode::FAILURE
        }
    }
}
