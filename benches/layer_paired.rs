//! The layer's cost over a bare service against tower_governor's, measured
//! in alternation within one process: each round sends a batch of allowed
//! requests (10,000 users round robin) through the bare service, through
//! `ThrottleLayer` (memory store) and through `GovernorLayer`, in a rotating
//! order, and the overheads are compared within the round. Drift of the
//! machine (other load, frequency) hits the three stacks of a round alike,
//! so the paired difference is far steadier than separate runs.
//!
//! `cargo bench --bench layer_paired`; `PAIRED_ROUNDS` (default 61),
//! `PAIRED_BATCH` (requests per stack and round, default 20,000) and
//! `PAIRED_MAX_SECS` (default 120) bound the run.

use std::time::{Duration, Instant};

use tower::Layer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[path = "common/user_header.rs"]
mod user_header;
use user_header::{UserHeader, USER};

#[path = "common/traffic.rs"]
mod traffic;
use traffic::{env, inner, quantile, users};

const USERS: usize = 10_000;

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

fn main() {
    let rounds = env("PAIRED_ROUNDS", 61).max(1) as usize;
    let n = env("PAIRED_BATCH", 20_000).max(1) as usize;
    let deadline = Instant::now() + Duration::from_secs(env("PAIRED_MAX_SECS", 120));
    let users = users(USERS);
    // Limits no request reaches: every request takes the allowed path.
    let mut bare = inner();
    let mut ours = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::cell(999_999, 1, Duration::from_secs(1)).unwrap(),
    )
    .key(HeaderKey::new(USER))
    .layer(inner());
    let config = GovernorConfigBuilder::default()
        .key_extractor(UserHeader)
        .period(Duration::from_secs(1))
        .burst_size(1_000_000)
        .finish()
        .unwrap();
    let mut governed = GovernorLayer::new(config).layer(inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // Warm every user's state in both limiters, and the code paths.
    rt.block_on(async {
        traffic::batch(&mut bare, &USER, &users, USERS).await;
        traffic::batch(&mut ours, &USER, &users, USERS * 2).await;
        traffic::batch(&mut governed, &USER, &users, USERS * 2).await;
    });
    let (mut b, mut t, mut g) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        if Instant::now() > deadline {
            eprintln!("stopped after {round} rounds: PAIRED_MAX_SECS reached");
            break;
        }
        let mut times = [0.0; 3];
        // Rotate the order, so no stack always runs first or last.
        for k in 0..3 {
            let which = (round + k) % 3;
            times[which] = rt.block_on(async {
                match which {
                    0 => traffic::batch(&mut bare, &USER, &users, n).await,
                    1 => traffic::batch(&mut ours, &USER, &users, n).await,
                    _ => traffic::batch(&mut governed, &USER, &users, n).await,
                }
            });
        }
        b.push(times[0]);
        t.push(times[1]);
        g.push(times[2]);
    }
    let done = b.len();
    let mut ours_over: Vec<f64> = (0..done).map(|i| t[i] - b[i]).collect();
    let mut gov_over: Vec<f64> = (0..done).map(|i| g[i] - b[i]).collect();
    let mut diff: Vec<f64> = (0..done).map(|i| t[i] - g[i]).collect();
    let mut ratio: Vec<f64> = (0..done).map(|i| (t[i] - b[i]) / (g[i] - b[i])).collect();
    let not_above = diff.iter().filter(|&&d| d <= 0.0).count();
    println!("layer_paired: {done} rounds of {n} allowed requests per stack, 10k users");
    println!(
        "ns/request, median: bare {:.1}, tower_throttle {:.1}, tower_governor {:.1}",
        median(&mut b),
        median(&mut t),
        median(&mut g)
    );
    println!(
        "overhead over bare, median of rounds: tower_throttle {:.1} ns, tower_governor {:.1} ns",
        median(&mut ours_over),
        median(&mut gov_over)
    );
    println!(
        "tower_throttle - tower_governor, per round: median {:+.1} ns (quartiles {:+.1} .. {:+.1}); \
         tower_throttle's overhead / tower_governor's: median {:.3}",
        median(&mut diff),
        quantile(&mut diff, 0.25),
        quantile(&mut diff, 0.75),
        median(&mut ratio)
    );
    println!("rounds where tower_throttle's overhead <= tower_governor's: {not_above}/{done}");
}
