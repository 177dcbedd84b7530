//! Leases over a real Redis: four app instances — four independent
//! `RedisStore` clients, each with its own connection and `LeasingStore` —
//! on one global fixed-window key.
//!
//! * Hammered far above the limit: no window admits more than the limit,
//!   no admission is served after the window it was charged in has ended,
//!   and the server runs a small share of a script per admitted check.
//! * Paced just below the limit: a denial (a false one: demand is under the
//!   limit) happens only once the window has admitted all but the units the
//!   instances may hold, `limit − instances × (max_block + max_block / 4)`
//!   (module docs of `store::lease`, *Block size and fairness*).
//!
//! The stores decide on one client clock shared with the leases
//! (`TimeSource::client`), so that an admission's window is read exactly
//! from its receipt, not estimated across two clocks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_throttle::clock::{Clock, SystemClock};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{Charge, Store};
use tower_throttle::Policy;

use crate::faults;
use crate::redis_support::{runtime, RedisServer};

const INSTANCES: usize = 4;
const LIMIT: u64 = 2_000;
const WINDOW: Duration = Duration::from_secs(1);
const MAX_BLOCK: u64 = 64;
const KEY: &[u8] = b"global";

async fn instance(url: &str, clock: &SystemClock) -> LeasingStore<RedisStore> {
    let redis = RedisStore::builder()
        .prefix("lease")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .connect(url)
        .await
        .unwrap();
    LeasingStore::builder(redis)
        .clock(clock.clone())
        .hot_threshold(32)
        .max_block(MAX_BLOCK)
        .blocks_per_period(8)
        .build()
        .unwrap()
}

/// What the instances saw: per charged window, admissions; per window of
/// the check's start, denials.
#[derive(Default)]
struct Tally {
    admitted: BTreeMap<u64, u64>,
    denied: BTreeMap<u64, u64>,
    checks: u64,
}

/// Runs at most `per_instance` checks on each instance for at most `span`,
/// `gap` apart (zero: as fast as it answers), and tallies them; panics on
/// an admission served after its window ended.
fn drive(
    server: &RedisServer,
    key: &[u8],
    per_instance: u64,
    span: Duration,
    gap: Duration,
) -> Tally {
    let rt = runtime();
    let policy = Policy::fixed_window(LIMIT, WINDOW).unwrap();
    let w = WINDOW.as_nanos() as u64;
    let clock = SystemClock::new();
    let tally = Arc::new(Mutex::new(Tally::default()));
    rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..INSTANCES {
            let store = instance(&server.url(), &clock).await;
            let (clock, tally, key) = (clock.clone(), tally.clone(), key.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut pace = tokio::time::interval(gap.max(Duration::from_nanos(1)));
                let end = tokio::time::Instant::now() + span;
                for _ in 0..per_instance {
                    if tokio::time::Instant::now() >= end {
                        break;
                    }
                    if !gap.is_zero() {
                        pace.tick().await;
                    }
                    let before = clock.now_ns();
                    let d = store.check(Charge::new(&key, &policy, 1)).await.unwrap();
                    let mut t = tally.lock().unwrap();
                    t.checks += 1;
                    if d.allowed {
                        let window = d.charged_at_ns / w;
                        assert!(
                            before < (window + 1) * w,
                            "served {} ns after its window ended",
                            before - (window + 1) * w
                        );
                        *t.admitted.entry(window).or_default() += 1;
                    } else {
                        *t.denied.entry(before / w).or_default() += 1;
                    }
                }
                store.shutdown().await.unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    Arc::into_inner(tally).unwrap().into_inner().unwrap()
}

#[test]
fn four_instances_never_admit_more_than_the_limit_of_a_window() {
    let server = RedisServer::start();
    let scripts_before = faults::script_calls(&server);
    // About three windows, as fast as the instances go.
    let tally = drive(&server, KEY, 1_000_000, WINDOW * 3, Duration::ZERO);
    let scripts = faults::script_calls(&server) - scripts_before;
    let admitted: u64 = tally.admitted.values().sum();
    eprintln!(
        "hammered: {} checks, {admitted} admitted in {:?}, {scripts} scripts run",
        tally.checks, tally.admitted
    );
    assert!(tally.admitted.len() >= 3, "windows: {:?}", tally.admitted);
    for (window, n) in &tally.admitted {
        assert!(*n <= LIMIT, "window {window}: {n} admitted, limit {LIMIT}");
    }
    // Denied checks each ask the store (the deny cache is another layer);
    // the admitted ones mostly do not.
    let denied = tally.checks - admitted;
    assert!(
        scripts < denied + admitted / 5,
        "{scripts} scripts for {admitted} admitted and {denied} denied"
    );
}

#[test]
fn under_the_limit_denials_need_a_nearly_full_window() {
    let server = RedisServer::start();
    // 80% of the limit between the four instances, for about 2.5 windows.
    let gap = WINDOW * INSTANCES as u32 / (LIMIT as u32 * 8 / 10);
    let tally = drive(&server, b"paced", 1_000, WINDOW * 3, gap);
    let denied: u64 = tally.denied.values().sum();
    eprintln!(
        "paced: {} checks, admitted {:?}, denied {:?}",
        tally.checks, tally.admitted, tally.denied
    );
    // Each instance holds at most a lease down to a quarter of its block
    // and the next block, prefetched.
    let floor = LIMIT - INSTANCES as u64 * (MAX_BLOCK + (MAX_BLOCK / 4).max(1));
    for (window, n) in &tally.denied {
        let admitted = tally.admitted.get(window).copied().unwrap_or(0);
        assert!(
            admitted >= floor,
            "window {window}: {n} denied with {admitted} admitted (floor {floor})"
        );
    }
    assert!(denied * 10 <= tally.checks, "{denied} denied");
}
