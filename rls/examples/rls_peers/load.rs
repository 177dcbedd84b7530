//! The client side: `ShouldRateLimit` over one HTTP/2 connection per
//! server with a fixed number of calls in flight, bounded in count and
//! time, and the paired rounds that compare servers within each round.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::Channel;

/// A client on one connection.
pub type Client = RateLimitServiceClient<Channel>;

/// Calls in flight at once.
pub const IN_FLIGHT: u64 = 64;

/// The request of index `i`.
pub type MakeRequest = Arc<dyn Fn(u64) -> RateLimitRequest + Send + Sync>;

/// A request of domain `bench` with one descriptor `user=<value>`.
pub fn user(value: String) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value,
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Connects to `addr` (one HTTP/2 connection, as Envoy keeps).
pub async fn connect(addr: SocketAddr) -> Result<Client, String> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())
}

/// Whether the server answers a descriptor no limit applies to.
pub async fn probe(addr: SocketAddr) -> bool {
    let Ok(mut c) = connect(addr).await else {
        return false;
    };
    let mut r = user(String::new());
    r.descriptors[0].entries[0].key = "probe".into();
    c.should_rate_limit(r).await.is_ok()
}

/// What one drive measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub rps: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Answers whose overall code is OK.
    pub ok: u64,
    /// Answers OVER_LIMIT (or another code).
    pub over: u64,
    /// Calls that failed.
    pub errors: u64,
}

/// Sends requests `0..count` (stopping early at `secs`), `in_flight` at a
/// time, request `i` to `clients[i % len]`.
pub async fn drive(
    clients: &[Client],
    in_flight: u64,
    secs: f64,
    count: u64,
    make: &MakeRequest,
) -> Sample {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let (next, make, clients) = (next.clone(), make.clone(), clients.to_vec());
            tokio::spawn(async move {
                let (mut times, mut tally) = (Vec::new(), [0u64; 3]);
                while Instant::now() < end {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    let mut c = clients[(i % clients.len() as u64) as usize].clone();
                    let req = make(i);
                    let t = Instant::now();
                    let r = c.should_rate_limit(req).await;
                    times.push(t.elapsed());
                    tally[match r {
                        Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => 0,
                        Ok(_) => 1,
                        Err(_) => 2,
                    }] += 1;
                }
                (times, tally)
            })
        })
        .collect();
    let (mut all, mut tally) = (Vec::new(), [0u64; 3]);
    for t in tasks {
        let (times, n) = t.await.expect("load task");
        all.extend(times);
        for k in 0..3 {
            tally[k] += n[k];
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort();
    let pick = |q: f64| {
        all.get(((all.len() as f64) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    Sample {
        rps: all.len() as f64 / elapsed,
        p50: pick(0.5),
        p99: pick(0.99),
        ok: tally[0],
        over: tally[1],
        errors: tally[2],
    }
}

/// The `q` quantile of `v` (sorted in place), nearest rank.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// One server in the paired rounds.
pub struct Contender {
    pub name: String,
    pub client: Client,
    pub samples: Vec<Sample>,
}

/// Bounds of the paired rounds.
pub struct Rounds {
    pub rounds: usize,
    pub secs: f64,
    /// Requests at most per server and round.
    pub cap: u64,
}

/// `rounds.rounds` rounds; in each, every contender is driven once for
/// `secs`, in an order that rotates each round, so no server always goes
/// first or last and drift of the machine hits all alike.
pub async fn paired(all: &mut [Contender], rounds: &Rounds, make: &MakeRequest) {
    for c in all.iter_mut() {
        // Warm the connections, the counters and the code paths.
        drive(
            std::slice::from_ref(&c.client),
            IN_FLIGHT,
            0.5,
            rounds.cap,
            make,
        )
        .await;
    }
    let n = all.len();
    for round in 0..rounds.rounds {
        for k in 0..n {
            let c = &mut all[(round + k) % n];
            let one = std::slice::from_ref(&c.client);
            let s = drive(one, IN_FLIGHT, rounds.secs, rounds.cap, make).await;
            c.samples.push(s);
        }
    }
}

/// Prints one markdown row per contender: its medians over the rounds and,
/// for each peer, the median and quartiles of the per-round ratios of
/// throttle-rls (the first contender) to it.
pub fn report(scenario: &str, all: &[Contender]) {
    let us = |d: Duration| d.as_nanos() as f64 / 1_000.0;
    let ours = &all[0].samples;
    for (k, c) in all.iter().enumerate() {
        let col = |f: &dyn Fn(&Sample) -> f64| -> Vec<f64> { c.samples.iter().map(f).collect() };
        let ratio = |f: &dyn Fn(&Sample) -> f64| -> Vec<f64> {
            ours.iter()
                .zip(&c.samples)
                .map(|(a, b)| f(a) / f(b))
                .collect()
        };
        let bad: u64 = c.samples.iter().map(|s| s.over + s.errors).sum();
        let vs = if k == 0 {
            "— | — | —".to_owned()
        } else {
            let mut r = ratio(&|s| s.rps);
            format!(
                "{:.2}× ({:.2}–{:.2}) | {:.2} | {:.2}",
                quantile(&mut r, 0.5),
                quantile(&mut r, 0.25),
                quantile(&mut r, 0.75),
                quantile(&mut ratio(&|s| us(s.p50)), 0.5),
                quantile(&mut ratio(&|s| us(s.p99)), 0.5)
            )
        };
        println!(
            "| {scenario} | {} | {:.0} | {:.0} | {:.0} | {vs} | {bad} |",
            c.name,
            quantile(&mut col(&|s| s.rps), 0.5),
            quantile(&mut col(&|s| us(s.p50)), 0.5),
            quantile(&mut col(&|s| us(s.p99)), 0.5),
        );
    }
}

/// The table's header.
pub fn header() {
    println!(
        "| scenario | server | requests/s | p50 µs | p99 µs | throttle-rls ÷ it, requests/s: median (quartiles) | p50 ratio | p99 ratio | not OK |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
}
