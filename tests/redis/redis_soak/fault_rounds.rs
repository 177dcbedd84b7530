//! The faults the soak runs one after another, and what is checked after each.

use std::time::{Duration, Instant};

use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

use super::{slots, Rng, RECOVERY, SOAK};
use crate::faults::Paused;
use crate::redis_support::RedisServer;
/// The leases held on the concurrency route's key (tombstones excluded).
fn leases(server: &RedisServer, store: &RedisStore) -> usize {
    let key = store.redis_key(b"slots:default:*", &slots());
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(&mut server.conn())
        .expect("ZRANGE");
    members.iter().filter(|m| !m.starts_with(b"x:")).count()
}

/// Probes until the store answers; the time it took.
async fn recovery(store: &RedisStore, fault: &str) -> Duration {
    let start = Instant::now();
    let probe = Policy::fixed_window(1_000_000, Duration::from_secs(3600)).unwrap();
    loop {
        let error = match store.check(Charge::new(b"probe", &probe, 1)).await {
            Ok(_) => return start.elapsed(),
            Err(e) => e,
        };
        assert!(
            start.elapsed() < RECOVERY,
            "after {fault}: no answer {:?} after the server was healthy: {error}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn admin(server: &RedisServer, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query(&mut server.conn()).expect("admin command");
}

/// The faults, one after another, until the soak time is up: each one's
/// name and how long the store took to answer again.
pub(super) async fn run(server: &mut RedisServer, store: &RedisStore) -> Vec<(String, Duration)> {
    let started = Instant::now();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut recoveries: Vec<(String, Duration)> = Vec::new();
    let mut round = 0;
    while started.elapsed() < SOAK {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(400))).await;
        let fault = match round % 4 {
            0 => {
                let paused = Paused::pause(server);
                tokio::time::sleep(Duration::from_millis(200 + rng.below(800))).await;
                paused.resume();
                "SIGSTOP"
            }
            1 => {
                // The restart blocks (it waits for PING): off the workers.
                tokio::task::block_in_place(|| server.restart());
                "kill and restart"
            }
            2 => {
                admin(server, &["CLIENT", "KILL", "TYPE", "normal"]);
                "CLIENT KILL"
            }
            _ => {
                admin(server, &["SCRIPT", "FLUSH"]);
                "SCRIPT FLUSH"
            }
        };
        round += 1;
        recoveries.push((fault.to_owned(), recovery(store, fault).await));
    }
    recoveries
}

/// No lease outlives its request once the dust settles; when the wait began.
pub(super) async fn assert_leases_settle(server: &RedisServer, store: &RedisStore) -> Instant {
    let settle = Instant::now();
    while leases(server, store) > 0 {
        assert!(
            settle.elapsed() < Duration::from_secs(5),
            "{} leases held after every request ended",
            leases(server, store)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle
}
