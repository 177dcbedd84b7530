//! GCRA on Redis in nanoseconds, its tats stored modulo 1000·2^43 ns
//! (`gcra.lua`): decisions within microseconds of the horizon at intervals
//! whole in µs or not, across the 2^53 ns wrap, several checks of one key
//! in one batch, and expiries at whole seconds must all be the exact ones.

use crate::redis_support;

use std::time::{Duration, Instant};

use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, Store};

/// A whole second, in ns.
const START: u64 = 1_700_000_000_000_000_000;

/// A store on `clock`, its keys' TTLs padded by `padding`: the clock
/// stands still while real time runs them down (a key filled to the horizon
/// of T = 333 µs lives a second), so unpadded keys can expire under a test
/// on a stalled machine.
async fn redis_on(server: &RedisServer, clock: &ManualClock, padding: Duration) -> RedisStore {
    RedisStore::builder()
        .prefix("nf")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(padding)
        // Every check reaches the script: the local denial cache would
        // answer the ones just before the horizon itself.
        .deny_cache(0)
        .connect(server.url())
        .await
        .unwrap()
}

fn memory_on(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

/// Emission intervals of 333.333 µs, 999,999.667 µs, 1,000,000.333 µs and
/// 8,571,428.571 µs, and of 1 ms and 1 s exactly, each with its whole µs.
fn policies() -> Vec<(Policy, u64)> {
    vec![
        (
            Policy::cell(4, 1_000, Duration::from_secs(1)).unwrap(),
            1_000,
        ),
        (
            Policy::cell(2, 1, Duration::from_secs(1)).unwrap(),
            1_000_000,
        ),
        (Policy::cell(4, 3_000, Duration::from_secs(1)).unwrap(), 333),
        (
            Policy::cell(3, 1, Duration::from_nanos(999_999_667)).unwrap(),
            999_999,
        ),
        (
            Policy::cell(2, 1, Duration::from_nanos(1_000_000_333)).unwrap(),
            1_000_000,
        ),
        (
            Policy::cell(5, 7, Duration::from_secs(60)).unwrap(),
            8_571_428,
        ),
    ]
}

#[test]
fn decisions_microseconds_from_the_horizon_match_the_memory_store() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(START);
    runtime().block_on(async {
        let redis = redis_on(&server, &clock, Duration::from_secs(600)).await;
        let mem = memory_on(&clock);
        for (p, (policy, t_us)) in policies().iter().enumerate() {
            for cost in [0, 1, 2] {
                // Filled to the horizon at START, then checked where the
                // next admission becomes possible, ±8 µs.
                let at = t_us * cost.max(1);
                for us in at.saturating_sub(8)..=at + 8 {
                    let key = format!("p{p}-c{cost}-{us}");
                    let key = key.as_bytes();
                    clock.set_ns(START);
                    loop {
                        let m = mem.check(Charge::new(key, policy, 1)).await.unwrap();
                        let r = redis.check(Charge::new(key, policy, 1)).await.unwrap();
                        assert_eq!(m, r, "filling {key:?}");
                        if !m.allowed {
                            break;
                        }
                    }
                    clock.set_ns(START + us * 1_000);
                    let m = mem.check(Charge::new(key, policy, cost)).await.unwrap();
                    let r = redis.check(Charge::new(key, policy, cost)).await.unwrap();
                    assert_eq!(m, r, "{policy:?} cost {cost} at +{us} µs");
                }
            }
        }
    });
}

#[test]
fn one_key_checked_many_times_in_a_batch_is_charged_each_time() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(START);
    runtime().block_on(async {
        let redis = redis_on(&server, &clock, Duration::from_secs(600)).await;
        let mem = memory_on(&clock);
        let policy = Policy::cell(40, 3_000, Duration::from_secs(1)).unwrap();
        for round in 0..4u64 {
            // Concurrent checks share batches; one key repeats in each, and
            // after the first round some of its checks are denied.
            let checks = (0..30).map(|_| redis.check(Charge::new(b"crowd", &policy, 1)));
            let admitted = futures_util::future::join_all(checks)
                .await
                .into_iter()
                .filter(|d| d.as_ref().unwrap().allowed)
                .count();
            let mut want = 0;
            for _ in 0..30 {
                want += usize::from(
                    mem.check(Charge::new(b"crowd", &policy, 1))
                        .await
                        .unwrap()
                        .allowed,
                );
            }
            assert_eq!(admitted, want, "round {round}");
            let m = mem.check(Charge::new(b"crowd", &policy, 0)).await.unwrap();
            let r = redis
                .check(Charge::new(b"crowd", &policy, 0))
                .await
                .unwrap();
            assert_eq!(m, r, "round {round}");
            clock.advance(Duration::from_micros(1_001));
        }
    });
}

#[test]
fn expiries_next_to_a_whole_second_are_the_exact_ones() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(START);
    runtime().block_on(async {
        // No padding: the TTLs are the point.
        let redis = redis_on(&server, &clock, Duration::ZERO).await;
        // The k-th admission at START puts the tat k·333 ns before (T just
        // under a second) or after (just over) the k-th whole second: the
        // key expires at that second, or the next.
        for (t_ns, ahead) in [(999_999_667u64, 0u64), (1_000_000_333, 1)] {
            let policy = Policy::cell(20, 1, Duration::from_nanos(t_ns)).unwrap();
            let user = format!("t{t_ns}");
            let key = redis.redis_key(user.as_bytes(), &policy);
            for k in 1..=15u64 {
                let sent = Instant::now();
                let d = redis
                    .check(Charge::new(user.as_bytes(), &policy, 1))
                    .await
                    .unwrap();
                assert!(d.allowed, "admission {k}");
                let want = i64::try_from((k + ahead) * 1_000).unwrap();
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query(&mut server.conn())
                    .unwrap();
                // The TTL counts down in real time from the expiry this
                // admission set: by 50 ms at most, or by what a stalled
                // machine took since the check was sent (plus a ms of
                // rounding), never more.
                let ran = i64::try_from(sent.elapsed().as_millis()).unwrap() + 1;
                let slack = ran.max(50);
                assert!(
                    ttl <= want && ttl >= want - slack,
                    "T {t_ns} ns, admission {k}: PTTL {ttl} ms, want {want} (slack {slack} ms)"
                );
            }
        }
    });
}

/// Tats stored modulo 1000·2^43 ns: admissions, denials, refunds and a key
/// gone stale (kept alive by TTL padding) on both sides of a multiple of it
/// decide as the memory store does, and every stored value stays below it.
#[test]
fn tats_across_the_wrap_match_the_memory_store() {
    let wrap = 1000u64 << 43;
    // 194 wraps is 2024-01-27; start 2 s before it.
    let start = 194 * wrap - 2_000_000_000;
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(start);
    runtime().block_on(async {
        let redis = redis_on(&server, &clock, Duration::from_secs(600)).await;
        let mem = memory_on(&clock);
        let policies = [
            Policy::cell(4, 10, Duration::from_secs(3)).unwrap(),
            Policy::cell(2, 3_000, Duration::from_secs(1)).unwrap(),
        ];
        for (p, policy) in policies.iter().enumerate() {
            let user = format!("wrap{p}");
            let key = user.as_bytes();
            clock.set_ns(start);
            // 4 s in steps of 37 ms: across the wrap, admitted and denied.
            for step in 0..110u64 {
                let cost = step % 3;
                let m = mem.check(Charge::new(key, policy, cost)).await.unwrap();
                let r = redis.check(Charge::new(key, policy, cost)).await.unwrap();
                assert_eq!(m, r, "{policy:?} step {step}");
                if step % 10 == 5 {
                    if let Some(receipt) = m.receipt() {
                        mem.refund(key, policy, &receipt).await.unwrap();
                        redis.refund(key, policy, &receipt).await.unwrap();
                    }
                }
                let stored: Option<u64> = redis::cmd("GET")
                    .arg(redis.redis_key(key, policy))
                    .query(&mut server.conn())
                    .unwrap();
                assert!(stored.is_none_or(|v| v < wrap), "{stored:?}");
                clock.advance(Duration::from_millis(37));
            }
            // Stale by 5 minutes (the padding keeps the key): fresh again.
            clock.advance(Duration::from_secs(300));
            let m = mem.check(Charge::new(key, policy, 1)).await.unwrap();
            let r = redis.check(Charge::new(key, policy, 1)).await.unwrap();
            assert_eq!(m, r, "{policy:?} stale");
        }
    });
}

/// A wait (here `Limiter::wait`) longer than the GCRA tolerances Redis runs
/// reserves no further than them (`MAX_RESERVED_TOLERANCE_NS`): it is
/// answered as the memory store answers it, never refused as a policy
/// Redis cannot run. One a month: the next slot is 30 days out, beyond a
/// 25-day wait, and the policy stretched by 25 days (55 days) beyond the
/// range; a 20-day wait stretches it within.
#[test]
fn a_wait_beyond_the_range_of_redis_gcra_is_answered_not_refused() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(START);
    runtime().block_on(async {
        let redis = redis_on(&server, &clock, Duration::ZERO).await;
        let policy = Policy::cell(0, 1, Duration::from_secs(30 * 86_400)).unwrap();
        let on_redis = tower_throttle::Limiter::new(redis, policy);
        let in_memory = tower_throttle::Limiter::new(memory_on(&clock), policy);
        assert!(on_redis.check("u").await.unwrap().allowed);
        assert!(in_memory.check("u").await.unwrap().allowed);
        for days in [25, 20] {
            let max_wait = Duration::from_secs(days * 86_400);
            let r = on_redis.wait("u", max_wait).await;
            let m = in_memory.wait("u", max_wait).await.unwrap();
            let r = r.unwrap_or_else(|e| panic!("a wait of {days} days: {e}"));
            assert!(!r.allowed, "{days} days");
            assert_eq!(r, m, "{days} days");
        }
    });
}
