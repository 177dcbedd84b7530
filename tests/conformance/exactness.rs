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
//! Clock faults directly on the memory store are in tests/memory/memory_store.rs
//! (`clock_jumping_backwards_never_admits_more`, `stalled_clock_admits_only_the_burst`,
//! `huge_costs_and_extreme_times_do_not_panic`); skewed app clocks on Redis in
//! tests/redis/redis_store.rs (`skewed_app_clocks_are_irrelevant_with_server_time`).

use crate::models;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use models::Model;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, MemoryStore, Policy};

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

#[test]
fn eight_threads_admit_exactly_the_model_phase_by_phase() {
    let steps = schedule(PHASES);
    for (name, policy) in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = manual_store(&clock);
        let want = model_per_phase(&policy, clock.now_ns(), &steps, THREADS * PER_PHASE);
        let got: Arc<Vec<AtomicU64>> = Arc::new((0..PHASES).map(|_| AtomicU64::new(0)).collect());
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, clock, got, barrier, steps) = (
                    store.clone(),
                    clock.clone(),
                    got.clone(),
                    barrier.clone(),
                    steps.clone(),
                );
                std::thread::spawn(move || {
                    for (phase, step) in steps.iter().enumerate() {
                        barrier.wait();
                        let mut admitted = 0;
                        for _ in 0..PER_PHASE {
                            let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                            admitted += u64::from(d.allowed);
                        }
                        got[phase].fetch_add(admitted, Ordering::Relaxed);
                        barrier.wait();
                        // One thread moves time, while nobody checks.
                        if thread == 0 {
                            clock.advance(*step);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a checking thread panicked");
        }
        let got: Vec<u64> = got.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let (total, bound) = (got.iter().sum::<u64>(), want.iter().sum::<u64>());
        println!(
            "{name}: {} checks, admitted {total}, model {bound}",
            THREADS * PER_THREAD
        );
        for (phase, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: phase {phase} admitted {g}, model {w}");
        }
        assert_eq!(total, bound, "{name}");
    }
}

/// The clock advances while the threads check (no phases): every check sees
/// some instant of the schedule, so the model checking greedily at every one
/// of them bounds what can be admitted.
#[test]
fn free_running_clock_never_admits_more_than_the_model() {
    let steps: Vec<Duration> = schedule(400);
    for (name, policy) in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = manual_store(&clock);
        // The model checks before each step, so a last zero step covers the
        // instant after the final advance.
        let mut all = steps.clone();
        all.push(Duration::ZERO);
        let bound: u64 = model_per_phase(&policy, clock.now_ns(), &all, 1_000)
            .iter()
            .sum();
        let admitted = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, clock, admitted, steps) = (
                    store.clone(),
                    clock.clone(),
                    admitted.clone(),
                    steps.clone(),
                );
                std::thread::spawn(move || {
                    let mut steps = steps.into_iter();
                    for n in 0..PER_THREAD / 2 {
                        if thread == 0 && n % 12 == 11 {
                            if let Some(step) = steps.next() {
                                clock.advance(step);
                            }
                        }
                        let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                        admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a checking thread panicked");
        }
        let got = admitted.load(Ordering::Relaxed);
        println!("{name}: free-running admitted {got}, model bound {bound}");
        assert!(got <= bound, "{name}: admitted {got} > {bound}");
        assert!(got >= LIMIT, "{name}: admitted only {got}");
    }
}

/// All-or-nothing under concurrency: 8 threads with costs 1-3 hit a tight
/// per-second rule and two loose long-period rules in one call, while time
/// moves in phases. The loose rules are charged exactly the cost of the
/// requests every rule admitted, never a unit for a request one rule denied.
#[test]
fn multi_rule_checks_charge_only_admitted_requests() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = manual_store(&clock);
    let tight = Policy::sliding_log(5, Duration::from_secs(1)).unwrap();
    let daily = Policy::fixed_window(100_000, Duration::from_secs(86_400)).unwrap();
    let hourly = Policy::cell(99_999, 1, Duration::from_secs(3600)).unwrap();
    let steps = schedule(50);
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (store, clock, barrier, steps) =
                (store.clone(), clock.clone(), barrier.clone(), steps.clone());
            std::thread::spawn(move || {
                let cost = 1 + thread as u64 % 3;
                let (mut requests, mut units) = (0u64, 0u64);
                for step in steps {
                    barrier.wait();
                    for _ in 0..100 {
                        let rules = [
                            Charge::new(b"u:tight", &tight, cost),
                            Charge::new(b"u:daily", &daily, cost),
                            Charge::new(b"u:hourly", &hourly, cost),
                        ];
                        let d = store.check_all_sync(&rules).unwrap();
                        if d.iter().all(|d| d.allowed) {
                            requests += 1;
                            units += cost;
                        } else {
                            assert!(!d[0].allowed, "only the tight rule can deny");
                        }
                    }
                    barrier.wait();
                    if thread == 0 {
                        clock.advance(step);
                    }
                }
                (requests, units)
            })
        })
        .collect();
    let (mut requests, mut units) = (0, 0);
    for h in handles {
        let (r, u) = h.join().expect("a checking thread panicked");
        requests += r;
        units += u;
    }
    let peek = |key: &[u8], p: &Policy| store.check_sync(Charge::new(key, p, 0)).unwrap();
    println!("multi-rule: {requests} requests admitted, {units} units");
    assert!(requests > 0);
    assert_eq!(100_000 - peek(b"u:daily", &daily).remaining, units);
    assert_eq!(100_000 - peek(b"u:hourly", &hourly).remaining, units);
    // The tight rule: never more than 5 units in any second. Units charged at
    // one instant are all of one phase; the model replays that bound.
    assert!(
        units <= 5 * (1 + steps.iter().map(|s| s.as_secs() + 1).sum::<u64>()),
        "{units}"
    );
}

// ------------------------------------------------------------------ time ---

/// Through the `Limiter`: a clock jumping back and stalling, with 8 threads.
#[test]
fn limiter_with_a_clock_jumping_back_never_admits_more_than_forward_time_allows() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (name, policy) in policies() {
        let start = 1_700_000_000_000_000_000;
        let clock = ManualClock::starting_at(start);
        let limiter = Limiter::new(manual_store(&clock), policy);
        let mut admitted = 0u64;
        let mut forward = Duration::ZERO;
        let mut high = start;
        let mut last = None;
        for step in 0..2_000u64 {
            match step % 20 {
                // Back by 5 ms (never before the start): the state is ahead of now.
                13 => clock.set_ns(clock.now_ns().saturating_sub(5_000_000).max(start)),
                // Forward 1 ms, counted only past the highest time seen.
                0..=11 => {
                    clock.advance(Duration::from_millis(1));
                    if clock.now_ns() > high {
                        forward += Duration::from_nanos(clock.now_ns() - high);
                        high = clock.now_ns();
                    }
                }
                // Stalled.
                _ => {}
            }
            let d = rt.block_on(limiter.check("k")).unwrap();
            admitted += u64::from(d.allowed);
            last = d.receipt().or(last);
            // Peeks and refunds at odd times never panic.
            if step % 97 == 0 {
                if let Some(receipt) = last.take() {
                    rt.block_on(limiter.refund("k", &receipt)).unwrap();
                }
                let _ = rt.block_on(limiter.peek("k")).unwrap();
            }
        }
        // What the model admits checking every ms of the forward time, plus
        // one unit per refund.
        let refunds = 2_000 / 97 + 1;
        let mut steps = vec![Duration::from_millis(1); forward.as_millis() as usize];
        steps.push(Duration::ZERO);
        let bound: u64 = model_per_phase(&policy, start, &steps, 1_000)
            .iter()
            .sum::<u64>()
            + refunds;
        println!("{name}: clock back and stalled, admitted {admitted}, bound {bound}");
        assert!(admitted <= bound, "{name}: {admitted} > {bound}");
    }
}

/// Through the `ThrottleLayer`: the same clock faults, counted as 200 / 429.
#[tokio::test]
async fn layer_with_a_clock_jumping_back_never_admits_more() {
    use http::{Request, Response, StatusCode};
    use tower::{ServiceBuilder, ServiceExt};
    use tower_throttle::key::Global;
    use tower_throttle::ThrottleLayer;

    let start = 1_700_000_000_000_000_000;
    let clock = ManualClock::starting_at(start);
    let policy = Policy::cell(9, 10, Duration::from_secs(1)).unwrap(); // T = 100 ms, limit 10
    let svc = ServiceBuilder::new()
        .layer(ThrottleLayer::new(manual_store(&clock), policy).key(Global))
        .service_fn(|_req: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        });
    let (mut ok, mut limited) = (0u64, 0u64);
    for step in 0..1_000u64 {
        if step % 10 == 9 {
            clock.set_ns(clock.now_ns().saturating_sub(5_000_000_000).max(start));
        } else {
            clock.advance(Duration::from_millis(1));
        }
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        match res.status() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                let retry: u64 = res.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(retry >= 1, "Retry-After is never 0");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    // At most 900 ms of forward motion (never beyond the first 900 ms: the
    // jumps back cancel the rest): 10 + 9 admissions.
    println!("layer: clock back, 200 × {ok}, 429 × {limited}");
    assert!(ok <= 10 + 9, "{ok}");
    assert_eq!(ok + limited, 1_000);
}

#[test]
fn extreme_clocks_never_panic_through_the_limiter() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for start in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        let clock = ManualClock::starting_at(start);
        for (name, policy) in policies() {
            let limiter = Limiter::new(manual_store(&clock), policy);
            for cost in [0, 1, LIMIT, LIMIT + 1, u64::MAX] {
                let d = rt.block_on(limiter.check_n("k", cost)).unwrap();
                assert!(d.remaining <= LIMIT, "{name} at {start}: {d:?}");
                if cost > LIMIT {
                    assert!(d.is_never(), "{name} at {start} cost {cost}: {d:?}");
                }
            }
            clock.set_ns(start / 2);
            let d = rt.block_on(limiter.check("k")).unwrap();
            // A receipt of every unit there is, from the far past.
            let forged = Receipt::new(u64::MAX, start / 2, d.permit);
            rt.block_on(limiter.refund("k", &forged)).unwrap();
            clock.set_ns(start);
            let _ = rt.block_on(limiter.peek("k")).unwrap();
        }
    }
}

/// A memory store that is full decides new keys on the rule's shared
/// overflow state, never panics, never evicts live state and never holds
/// more keys than its cap, with threads racing for the last slots.
#[test]
fn full_store_under_concurrency_never_exceeds_the_cap() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(1_000)
        .evict_when_full(false)
        .overflow_buckets(1)
        .shards(8)
        .sweep_interval(None)
        .build();
    let policy = Policy::cell(0, 1, Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = (0..THREADS as u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut admitted = 0;
                for i in 0..1_000u32 {
                    let key = [t.to_le_bytes(), i.to_le_bytes()].concat();
                    match store.check_sync(Charge::new(&key, &policy, 1)) {
                        Ok(d) => admitted += usize::from(d.allowed),
                        Err(e) => panic!("{e}"),
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(store.len(), 1_000);
    // Every held key once, and the overflow state (1 a minute) once.
    assert_eq!(admitted, 1_001);
    assert_eq!(store.overflowed_checks() as usize, THREADS * 1_000 - 1_000);
}

// ----------------------------------------------------------------- Redis ---

#[cfg(feature = "redis")]
mod redis_exactness {
    use super::*;
    use crate::redis_support::{RedisCluster, RedisServer};
    use tokio::sync::Barrier as AsyncBarrier;
    use tower_throttle::store::redis::{HashTag, RedisStore, TimeSource};
    use tower_throttle::Store;

    const INSTANCES: usize = 4;
    const TASKS: usize = 8;
    const REDIS_PHASES: usize = 16;
    const REDIS_PER_PHASE: usize = 4;

    fn builder(
        clock: &ManualClock,
        prefix: &str,
    ) -> tower_throttle::store::redis::RedisStoreBuilder {
        RedisStore::builder()
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
            .hash_tag(HashTag::PerKey)
    }

    /// 4 instances × 8 tasks, phases as in the memory test; per phase the
    /// count admitted equals the model's.
    async fn phases_on<S: Store + Clone>(what: &str, stores: Vec<S>, clock: &ManualClock) {
        let steps = schedule(REDIS_PHASES);
        for (name, policy) in policies() {
            let key = format!("{what}:{name}").into_bytes();
            let want = model_per_phase(
                &policy,
                clock.now_ns() / 1000 * 1000,
                &steps,
                INSTANCES * TASKS * REDIS_PER_PHASE,
            );
            let got: Arc<Vec<AtomicU64>> =
                Arc::new((0..REDIS_PHASES).map(|_| AtomicU64::new(0)).collect());
            let barrier = Arc::new(AsyncBarrier::new(INSTANCES * TASKS));
            let mut tasks = Vec::new();
            for (i, store) in stores.iter().enumerate() {
                for t in 0..TASKS {
                    let (store, clock, got, barrier, steps, key) = (
                        store.clone(),
                        clock.clone(),
                        got.clone(),
                        barrier.clone(),
                        steps.clone(),
                        key.clone(),
                    );
                    tasks.push(tokio::spawn(async move {
                        for (phase, step) in steps.iter().enumerate() {
                            barrier.wait().await;
                            for _ in 0..REDIS_PER_PHASE {
                                let d = store.check(Charge::new(&key, &policy, 1)).await.unwrap();
                                got[phase].fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                            }
                            barrier.wait().await;
                            if i == 0 && t == 0 {
                                clock.advance(*step);
                            }
                        }
                    }));
                }
            }
            for t in tasks {
                t.await.expect("a checking task panicked");
            }
            let got: Vec<u64> = got.iter().map(|a| a.load(Ordering::Relaxed)).collect();
            println!(
                "{what} {name}: {} checks, admitted {}, model {}",
                INSTANCES * TASKS * REDIS_PER_PHASE * REDIS_PHASES,
                got.iter().sum::<u64>(),
                want.iter().sum::<u64>()
            );
            assert_eq!(got, want, "{what} {name}: per phase");
            // Next algorithm from a clean instant.
            clock.advance(Duration::from_secs(10));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_instances_admit_exactly_the_model_on_redis() {
        let server = RedisServer::start();
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let mut stores = Vec::new();
        for _ in 0..INSTANCES {
            stores.push(builder(&clock, "x").connect(server.url()).await.unwrap());
        }
        phases_on("redis", stores, &clock).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_instances_admit_exactly_the_model_on_a_cluster() {
        let cluster = RedisCluster::start();
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let mut stores = Vec::new();
        for _ in 0..INSTANCES {
            stores.push(
                builder(&clock, "x")
                    .connect_cluster(cluster.urls())
                    .await
                    .unwrap(),
            );
        }
        phases_on("cluster", stores, &clock).await;
        // Multi-rule checks on a cluster need one hash tag for their keys.
        let mut tagged = Vec::new();
        for _ in 0..INSTANCES {
            tagged.push(
                builder(&clock, "m")
                    .hash_tag(HashTag::AfterFirst(b':'))
                    .connect_cluster(cluster.urls())
                    .await
                    .unwrap(),
            );
        }
        multi_rule_on("cluster", tagged).await;
    }

    /// All-or-nothing from 4 instances × 8 tasks: the loose rules are charged
    /// exactly the admitted requests' costs.
    async fn multi_rule_on<S: Store + Clone>(what: &str, stores: Vec<S>) {
        let tight = Policy::sliding_log(7, Duration::from_secs(3600)).unwrap();
        let loose = Policy::fixed_window(100_000, Duration::from_secs(86_400)).unwrap();
        let gcra = Policy::cell(99_999, 1, Duration::from_secs(3600)).unwrap();
        let mut tasks = Vec::new();
        for store in &stores {
            for t in 0..TASKS {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    let cost = 1 + t as u64 % 2;
                    let mut units = 0;
                    for _ in 0..10 {
                        // One hash tag after the first ':' so a cluster takes them in one script.
                        let rules = [
                            Charge::new(b"tight:alice", &tight, cost),
                            Charge::new(b"loose:alice", &loose, cost),
                            Charge::new(b"gcra:alice", &gcra, cost),
                        ];
                        let d = store.check_all(&rules).await.unwrap();
                        if d.iter().all(|d| d.allowed) {
                            units += cost;
                        }
                    }
                    units
                }));
            }
        }
        let mut units = 0;
        for t in tasks {
            units += t.await.unwrap();
        }
        let store = &stores[0];
        let peek = |k: &'static [u8], p: Policy| async move {
            store.check(Charge::new(k, &p, 0)).await.unwrap().remaining
        };
        println!("{what} multi-rule: {units} units admitted of 7");
        assert!(units == 7 || units == 6, "{units}");
        assert_eq!(7 - peek(b"tight:alice", tight).await, units);
        assert_eq!(100_000 - peek(b"loose:alice", loose).await, units);
        assert_eq!(100_000 - peek(b"gcra:alice", gcra).await, units);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn multi_rule_checks_charge_only_admitted_requests_on_redis() {
        let server = RedisServer::start();
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let mut stores = Vec::new();
        for _ in 0..INSTANCES {
            stores.push(
                builder(&clock, "m")
                    .hash_tag(HashTag::AfterFirst(b':'))
                    .connect(server.url())
                    .await
                    .unwrap(),
            );
        }
        multi_rule_on("redis", stores).await;
    }
}
