//! The Redis store against a private `redis-server`: decision-by-decision
//! agreement with the memory store, all-or-nothing rules, TTLs, server time,
//! several app instances, reconnects, hostile keys and typed errors.

use crate::model_bench;
use crate::redis_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use model_bench::{with_ops, Bench, Op};
use proptest::prelude::*;
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::CellStore;
use tower_throttle::store::Charge;
use tower_throttle::{Decision, MemoryStore, Policy, Store, StoreError};

/// A store on `clock`; TTLs padded so that real time passing faster than
/// the frozen test clock never expires state the model still holds.
async fn client_store(url: &str, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("t")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .connect(url)
        .await
        .unwrap()
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn no_permit(d: Decision) -> Decision {
    model_bench::strip_permit(d)
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

// ---------------------------------------------------------------- models ---

fn gcra() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (0u64..=5, 1u64..=3_000_000).prop_flat_map(|(burst, t)| {
        with_ops(Policy::cell(burst, 1, us(t)).unwrap(), t * (burst + 1))
    })
}

const YEAR: u64 = 365 * 86_400;

/// GCRA at intervals that are not whole microseconds: 3/s, 7/min, 7/day,
/// redis-cell's arguments with counts up to 10^6 and periods up to a year,
/// funnels at any rate.
fn gcra_ns() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let cell = (0u64..=5, 1u64..=1_000_000, 1u64..=YEAR)
        .prop_map(|(b, n, s)| Policy::cell(b, n, Duration::from_secs(s)).unwrap());
    let named = prop_oneof![
        Just(Policy::token_bucket(10, 3.0).unwrap()),
        Just(Policy::cell(15, 7, Duration::from_secs(60)).unwrap()),
        Just(Policy::cell(3, 7, Duration::from_secs(86_400)).unwrap()),
        Just(Policy::funnel(3, 3.0).unwrap()),
        Just(Policy::cell(100, 853, Duration::from_secs(3)).unwrap()),
    ];
    let nanos = (0u64..=5, 1u64..=3_000_000_000)
        .prop_map(|(b, t)| Policy::cell(b, 1, Duration::from_nanos(t)).unwrap());
    let rate = (1u64..=6, 1e-3f64..1e7).prop_map(|(c, r)| Policy::funnel(c, r).unwrap());
    prop_oneof![cell, named, nanos, rate].prop_flat_map(|p| {
        let span = (p.window().as_micros() as u64).clamp(1, 1 << 40);
        with_ops(p, span)
    })
}

fn window(
    f: fn(u64, Duration) -> Result<Policy, tower_throttle::PolicyError>,
) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=6, 1u64..=3_000_000).prop_flat_map(move |(max, w)| with_ops(f(max, us(w)).unwrap(), w))
}

fn concurrency() -> impl Strategy<Value = (Policy, Vec<Op>)> {
    (1u64..=5, 1u64..=3_000_000).prop_flat_map(|(max, lease)| {
        with_ops(
            Policy::concurrency_with_lease(max, us(lease)).unwrap(),
            lease,
        )
    })
}

model_test!(gcra_matches_memory_store, gcra());
model_test!(gcra_at_any_interval_matches_memory_store, gcra_ns());
model_test!(
    sliding_log_matches_memory_store,
    window(Policy::sliding_log)
);
model_test!(
    fixed_window_matches_memory_store,
    window(Policy::fixed_window)
);
model_test!(
    sliding_window_matches_memory_store,
    window(Policy::sliding_window)
);
model_test!(concurrency_matches_memory_store, concurrency());

#[test]
fn sliding_log_bursts_at_one_instant_are_counted_exactly() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let p = Policy::sliding_log(30, Duration::from_secs(60)).unwrap();
        let k = b"burst";
        // Same-instant units, refunds from the top, more units, bigger bursts.
        for (cost, refund) in [(12, 3), (5, 0), (0, 0), (9, 11), (25, 0), (14, 2), (3, 0)] {
            let m = mem.check(Charge::new(k, &p, cost)).await.unwrap();
            let r = redis.check(Charge::new(k, &p, cost)).await.unwrap();
            assert_eq!(m, r, "cost {cost}");
            if let (Some(a), Some(b)) = (m.receipt(), r.receipt()) {
                mem.refund(k, &p, &a.part(refund)).await.unwrap();
                redis.refund(k, &p, &b.part(refund)).await.unwrap();
            }
        }
        let members: u64 = redis::cmd("ZCARD")
            .arg(redis.redis_key(k, &p))
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            members,
            30 - mem.check(Charge::new(k, &p, 0)).await.unwrap().remaining
        );
    });
}

// ----------------------------------------------------------- redis-cell ---

#[test]
fn cl_throttle_examples_from_the_design() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let manual = client_store(&server.url(), &clock).await;
        let on_server = RedisStore::builder()
            .prefix("srv")
            .connect(server.url())
            .await
            .unwrap();
        let p = Policy::cell(15, 30, Duration::from_secs(60)).unwrap();
        for store in [&manual, &on_server] {
            // On the server's clock the last reply's times (rounded up to
            // whole seconds) are the design's while the 17 checks take under
            // a second: a run the machine stalled longer goes again on a
            // fresh key. The manual clock never moves.
            for attempt in 0..10 {
                let key = format!("laoqian{attempt}");
                let rule = Charge::new(key.as_bytes(), &p, 1);
                let started = Instant::now();
                let first = store.check(rule).await.unwrap().to_cell_reply();
                let mut burst = Vec::new();
                for _ in 0..15 {
                    burst.push(store.check(rule).await.unwrap().allowed);
                }
                let last = store.check(rule).await.unwrap().to_cell_reply();
                if started.elapsed() >= Duration::from_millis(900) && attempt < 9 {
                    continue;
                }
                assert_eq!(first, [0, 16, 15, -1, 2]);
                assert!(burst.iter().all(|&allowed| allowed));
                assert_eq!(last, [1, 16, 0, 2, 32]);
                break;
            }
        }
    });
}

#[test]
fn cell_store_reports_a_missing_module_clearly() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let err = CellStore::connect(RedisStore::builder(), server.url())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("redis-cell"), "{err}");
        let err = CellStore::builder()
            .prefix("cells")
            .timeout(Duration::from_secs(2))
            .require_safe_eviction(true)
            .connect(server.url())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("redis-cell"), "{err}");
    });
}

// --------------------------------------------------------- all or nothing ---

fn five(n: u64) -> Vec<Policy> {
    let w = Duration::from_secs(10);
    vec![
        Policy::cell(n - 1, 1, w).unwrap(),
        Policy::sliding_log(n, w).unwrap(),
        Policy::fixed_window(n, w).unwrap(),
        Policy::sliding_window(n, w).unwrap(),
        Policy::concurrency_with_lease(n, w).unwrap(),
    ]
}

#[test]
fn multi_rule_checks_are_all_or_nothing_and_match_memory() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let policies = five(3);
        let tight = Policy::fixed_window(1, Duration::from_secs(10)).unwrap();
        let names: Vec<Vec<u8>> = (0..5).map(|i| format!("rule{i}").into_bytes()).collect();
        let mut rules: Vec<Charge<'_>> = names
            .iter()
            .zip(&policies)
            .map(|(k, p)| Charge::new(k, p, 1))
            .collect();
        rules.push(Charge::new(b"tight", &tight, 1));
        for round in 0..4 {
            let m = mem.check_all(&rules).await.unwrap();
            let r = redis.check_all(&rules).await.unwrap();
            let strip = |v: Vec<Decision>| v.into_iter().map(no_permit).collect::<Vec<_>>();
            assert_eq!(strip(m.clone()), strip(r.clone()), "round {round}");
            // Only the first round fits the tight rule; later rounds charge nothing.
            assert_eq!(r.iter().all(|d| d.allowed), round == 0);
            for d in &r[..5] {
                assert!(d.allowed);
                assert_eq!(
                    d.remaining, 2,
                    "round {round}: the failed rounds consumed nothing"
                );
            }
            clock.advance(Duration::from_millis(1));
        }
        for (k, p) in names.iter().zip(&policies) {
            let peek = redis.check(Charge::new(k, p, 0)).await.unwrap();
            assert_eq!(peek.remaining, 2);
        }
        let dup = [
            Charge::new(b"same", &tight, 1),
            Charge::new(b"same", &policies[0], 1),
        ];
        assert!(matches!(
            redis.check_all(&dup).await,
            Err(StoreError::InvalidRequest(_))
        ));
    });
}

// ------------------------------------------------------------------ TTLs ---

fn keys_and_ttls(server: &RedisServer, pattern: &str) -> Vec<(Vec<u8>, i64)> {
    let mut con = server.conn();
    let mut cursor = 0u64;
    let mut out = Vec::new();
    for _ in 0..1000 {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(100)
            .query(&mut con)
            .unwrap();
        for k in keys {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut con).unwrap();
            out.push((k, ttl));
        }
        if next == 0 {
            return out;
        }
        cursor = next;
    }
    panic!("SCAN did not finish");
}

#[test]
fn every_key_has_a_ttl_within_the_policy_bound() {
    let server = RedisServer::start();
    // A frozen clock 1 s into a 10 s window: with the server's own clock a
    // window could end mid-test and take a key (and its TTL) with it.
    let clock = ManualClock::starting_at(1_700_000_001_000_000_000);
    runtime().block_on(async {
        let store = RedisStore::builder()
            .prefix("ttl")
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap();
        let policies = five(3);
        // GCRA τ = 3 × 10 s (its expiry rounded up to a whole second), log w,
        // fixed w (aligned: at most w), sliding 2w, lease.
        let bounds = [31_000, 10_000, 10_000, 20_000, 10_000];
        let assert_ttls = |step: &str| {
            let found = keys_and_ttls(&server, "ttl:*");
            for (key, ttl) in &found {
                let i = policies
                    .iter()
                    .position(|p| key[15] == store.redis_key(b"", p)[15]) // ttl:{tag}:<algo>:
                    .expect("a key of a known algorithm");
                assert!(
                    *ttl > 0 && *ttl <= bounds[i],
                    "{step}: {} PTTL {ttl} ms",
                    String::from_utf8_lossy(key)
                );
            }
            found.len()
        };
        for (i, p) in policies.iter().enumerate() {
            let key = format!("k{i}").into_bytes();
            let admitted = store.check(Charge::new(&key, p, 2)).await.unwrap();
            assert!(admitted.allowed);
            assert_ttls("after an admission");
            assert!(!store.check(Charge::new(&key, p, 2)).await.unwrap().allowed);
            assert_ttls("after a denial");
            let receipt = admitted.receipt().expect("an admitted charge");
            store.refund(&key, p, &receipt.part(1)).await.unwrap();
            assert_ttls("after a refund");
            // A second key checked then fully given back leaves nothing behind.
            let gone = format!("gone{i}").into_bytes();
            let d = store.check(Charge::new(&gone, p, 1)).await.unwrap();
            if let Some(id) = d.permit {
                store.release(&gone, p, id).await.unwrap();
            } else {
                let receipt = d.receipt().expect("an admitted charge");
                store.refund(&gone, p, &receipt).await.unwrap();
            }
        }
        assert_eq!(assert_ttls("at the end"), 5);
    });
}

// ------------------------------------------------------------ server time ---

/// Sends `n` checks alternately through two store instances; counts the admitted.
async fn alternate<A: Store, B: Store>(a: &A, b: &B, rule: Charge<'_>, n: usize) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        let d = if i % 2 == 0 {
            a.check(rule).await
        } else {
            b.check(rule).await
        };
        admitted += u64::from(d.unwrap().allowed);
    }
    admitted
}

#[test]
fn skewed_app_clocks_are_irrelevant_with_server_time() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let p = Policy::cell(9, 1, Duration::from_secs(3600)).unwrap();
        let rule = Charge::new(b"user", &p, 1);
        // Two app instances whose own clocks are hours apart, on server time.
        let a = RedisStore::connect(server.url()).await.unwrap();
        let b = RedisStore::connect(server.url()).await.unwrap();
        let admitted = alternate(&a, &b, rule, 30).await;
        assert_eq!(admitted, 10);
        let asked = Instant::now();
        let (da, db) = (a.check(rule).await.unwrap(), b.check(rule).await.unwrap());
        // On one clock the resets differ by the time between the two checks:
        // under a second, or at most what a stalled machine took.
        let between = asked.elapsed().max(Duration::from_secs(1));
        let diff = da.reset_after.abs_diff(db.reset_after);
        assert!(diff < between, "{da:?} vs {db:?}");

        // The same two instances trusting their own skewed clocks disagree:
        // the one two hours ahead sees the other's state as long gone.
        let early = ManualClock::starting_at(1_700_000_000_000_000_000);
        let late = ManualClock::starting_at(1_700_000_000_000_000_000 + 7_200_000_000_000);
        let a = client_store(&server.url(), &early).await;
        let b = client_store(&server.url(), &late).await;
        let rule = Charge::new(b"skewed", &p, 1);
        let admitted = alternate(&a, &b, rule, 30).await;
        assert!(
            admitted > 10,
            "client clocks skewed by 2 h over-admit: {admitted}"
        );
    });
}

// ------------------------------------------------------ several instances ---

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_hammering_one_key_admit_exactly_the_bound() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(Arc::new(client_store(&server.url(), &frozen).await));
    }
    let bound = 50;
    for (i, policy) in five(bound).into_iter().enumerate() {
        let key = format!("hot{i}").into_bytes();
        let mut tasks = Vec::new();
        for store in &stores {
            for _ in 0..8 {
                let (store, key) = (store.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0u64;
                    for _ in 0..20 {
                        let d = store.check(Charge::new(&key, &policy, 1)).await.unwrap();
                        admitted += u64::from(d.allowed);
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(
            total, bound,
            "policy {i}: 4 instances × 8 tasks × 20 checks"
        );
    }
    // On server time too (GCRA refills one unit an hour: nothing comes back).
    let p = Policy::cell(bound - 1, 1, Duration::from_secs(3600)).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = Arc::new(RedisStore::connect(server.url()).await.unwrap());
        for _ in 0..8 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..20 {
                    admitted += u64::from(
                        store
                            .check(Charge::new(b"srv", &p, 1))
                            .await
                            .unwrap()
                            .allowed,
                    );
                }
                admitted
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, bound);
}

// --------------------------------------------------------------- failures ---

#[test]
fn reconnects_after_the_server_restarts() {
    let mut server = RedisServer::start();
    runtime().block_on(async {
        let timeout = Duration::from_millis(300);
        let store = RedisStore::builder()
            .timeout(timeout)
            .connect(server.url())
            .await
            .unwrap();
        let p = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
        let rule = Charge::new(b"k", &p, 1);
        assert!(store.check(rule).await.unwrap().allowed);

        server.stop();
        for _ in 0..3 {
            let t0 = Instant::now();
            let err = store.check(rule).await.unwrap_err();
            assert!(
                matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
                "{err:?}"
            );
            assert!(t0.elapsed() < timeout * 3, "answered in {:?}", t0.elapsed());
        }

        server.start_again();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match store.check(rule).await {
                Ok(d) => {
                    // The restarted server lost the state (no persistence).
                    assert_eq!(d.remaining, 99);
                    break;
                }
                Err(StoreError::Connection(_) | StoreError::Timeout(_))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("no recovery: {e:?}"),
            }
        }
    });
}

#[test]
fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        let p = Policy::sliding_log(5, Duration::from_secs(60)).unwrap();
        assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            store
                .check(Charge::new(b"k", &p, 1))
                .await
                .unwrap()
                .remaining,
            3
        );
    });
}

#[test]
fn errors_are_typed() {
    runtime().block_on(async {
        // Nothing listens: connection refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = RedisStore::connect(format!("redis://127.0.0.1:{port}/"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
            "{err:?}"
        );

        // Something accepts but never answers: the store timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}/", silent.local_addr().unwrap());
        let held = std::thread::spawn(move || {
            let (sock, _) = silent.accept().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            drop(sock);
        });
        let t0 = Instant::now();
        let err = RedisStore::builder()
            .timeout(Duration::from_millis(200))
            .connect(url)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Timeout(_) | StoreError::Connection(_)),
            "{err:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        held.join().unwrap();

        let bad_prefix = RedisStore::builder()
            .prefix("a{b}")
            .connect("redis://127.0.0.1:1/")
            .await;
        assert!(matches!(bad_prefix, Err(StoreError::InvalidRequest(_))));
    });
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        // Beyond 2^50 µs or a count of 2^50: refused; a window under a µs
        // and a sliding window's products past 2^53 run.
        for p in [
            Policy::fixed_window(1, Duration::from_micros((1 << 50) + 1)).unwrap(),
            Policy::sliding_window((1 << 50) + 1, Duration::from_secs(3600)).unwrap(),
        ] {
            let err = store.check(Charge::new(b"k", &p, 1)).await.unwrap_err();
            assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        }
        for p in [
            Policy::fixed_window(1, Duration::from_nanos(999)).unwrap(),
            Policy::sliding_window(1 << 40, Duration::from_secs(3600)).unwrap(),
        ] {
            assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        }
        // A key of another type under a GCRA name: a typed error naming
        // the key, which is repaired (deleted): the next check is fresh.
        let p = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let key = store.redis_key(b"clobbered", &p);
        let _: () = redis::cmd("LPUSH")
            .arg(&key)
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let err = store
            .check(Charge::new(b"clobbered", &p, 1))
            .await
            .unwrap_err();
        let StoreError::ForeignData { key: named, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(named.as_bytes(), &key[..]);
        let d = store.check(Charge::new(b"clobbered", &p, 1)).await.unwrap();
        assert_eq!(d.to_cell_reply(), [0, 2, 1, -1, 1]);
        // Every other algorithm likewise.
        let p = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
        let key = store.redis_key(b"clobbered", &p);
        let _: () = redis::cmd("LPUSH")
            .arg(&key)
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let err = store
            .check(Charge::new(b"clobbered", &p, 1))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::ForeignData { .. }), "{err:?}");
        assert!(
            store
                .check(Charge::new(b"clobbered", &p, 1))
                .await
                .unwrap()
                .allowed
        );
    });
}

// ------------------------------------------------------------ hostile keys ---

pub fn hostile_keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = [
        &b""[..],
        b"{",
        b"}",
        b"{}",
        b"}{",
        b"a{b}c",
        b"{user}:x",
        b"line\nbreak",
        b"nul\0byte",
        b"\r\n*3\r\n$3\r\nDEL\r\n",
        "ünïcödé".as_bytes(),
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    keys.push(vec![b'{'; 10_000]);
    keys.push((0..10_000u32).map(|i| (i * 7919 % 251) as u8).collect());
    let mut near = vec![b'}'; 10_000];
    near[9_999] = b'{';
    keys.push(near);
    keys
}

#[test]
fn hostile_keys_are_independent_and_bounded() {
    let server = RedisServer::start();
    runtime().block_on(async {
        // A frozen clock with padded TTLs: on the server's clock a 10 s
        // window could end mid-test and take its keys with it.
        let store = RedisStore::builder()
            .prefix("h")
            .time_source(TimeSource::client(ManualClock::new()))
            .ttl_padding(Duration::from_secs(600))
            .connect(server.url())
            .await
            .unwrap();
        let keys = hostile_keys();
        for p in five(3) {
            for k in &keys {
                let d = store.check(Charge::new(k, &p, 1)).await.unwrap();
                assert!(d.allowed);
                assert_eq!(
                    d.remaining,
                    2,
                    "every key starts fresh: {:?}",
                    String::from_utf8_lossy(&k[..k.len().min(20)])
                );
                let rk = store.redis_key(k, &p);
                assert!(rk.len() <= 2 + 12 + 2 + 1 + 128, "{} bytes", rk.len());
            }
        }
        assert_eq!(keys_and_ttls(&server, "h:*").len(), keys.len() * 5);
    });
}

// ------------------------------------------------------------- batching ---

fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix("calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

/// Many callers at once on one store: checks are coalesced into fewer
/// script calls, and the calls evaluate them in order, so each admitted
/// check sees the ones before it (remaining counts down without repeats)
/// and exactly the bound is admitted, for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_callers_on_one_key_admit_exactly_the_bound_in_order() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = Arc::new(
        RedisStore::builder()
            .prefix("t")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(frozen.clone()))
            .ttl_padding(Duration::from_secs(600))
            .deny_cache(0)
            .connect(server.url())
            .await
            .unwrap(),
    );
    let bound = 40;
    let calls0 = evalsha_calls(&server);
    for (i, policy) in five(bound).into_iter().enumerate() {
        let key = format!("batch{i}").into_bytes();
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(
                    async move { store.check(Charge::new(&key, &policy, 1)).await.unwrap() },
                )
            })
            .collect();
        let mut remaining = Vec::new();
        for t in tasks {
            let d = t.await.unwrap();
            if d.allowed {
                remaining.push(d.remaining);
            }
        }
        remaining.sort_unstable();
        assert_eq!(
            remaining,
            (0..bound).collect::<Vec<_>>(),
            "policy {i}: each admission saw every earlier one"
        );
    }
    let calls = evalsha_calls(&server) - calls0;
    assert!(
        calls < 5 * 200,
        "{calls} script calls for 1000 checks: no batching"
    );
}

/// One batch mixing algorithms, keys, multi-rule checks and the same key
/// several times: every key ends exactly at its bound, and multi-rule checks
/// stay all-or-nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_mixing_keys_algorithms_and_multi_rule_checks() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = Arc::new(client_store(&server.url(), &frozen).await);
    let policies = Arc::new(five(7));
    let tight = Policy::fixed_window(3, Duration::from_secs(10)).unwrap();
    let mut tasks = Vec::new();
    for round in 0..20u64 {
        for (i, _) in policies.iter().enumerate() {
            for k in 0..3 {
                let (store, policies) = (store.clone(), policies.clone());
                tasks.push(tokio::spawn(async move {
                    let key = format!("mix{i}:{k}");
                    let d = store
                        .check(Charge::new(key.as_bytes(), &policies[i], 1 + round % 2))
                        .await
                        .unwrap();
                    (format!("{i}:{k}"), u64::from(d.allowed) * (1 + round % 2))
                }));
            }
        }
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let g = Policy::cell(99, 1, Duration::from_secs(3600)).unwrap();
            let rules = [
                Charge::new(b"pair:a", &g, 1),
                Charge::new(b"pair:b", &tight, 1),
            ];
            let d = store.check_all(&rules).await.unwrap();
            ("pair".to_string(), u64::from(d.iter().all(|d| d.allowed)))
        }));
    }
    let mut used = std::collections::HashMap::<String, u64>::new();
    for t in tasks {
        let (k, n) = t.await.unwrap();
        *used.entry(k).or_default() += n;
    }
    assert_eq!(used["pair"], 3);
    // All or nothing: the GCRA rule was charged only with the window's 3.
    let g = Policy::cell(99, 1, Duration::from_secs(3600)).unwrap();
    let peek = store.check(Charge::new(b"pair:a", &g, 0)).await.unwrap();
    assert_eq!(peek.remaining, 97);
    for (i, p) in policies.iter().enumerate() {
        for k in 0..3 {
            let key = format!("mix{i}:{k}");
            let n = used[&format!("{i}:{k}")];
            assert!((6..=7).contains(&n), "{key}: {n} units admitted of 7");
            let peek = store
                .check(Charge::new(key.as_bytes(), p, 0))
                .await
                .unwrap();
            assert_eq!(peek.remaining, 7 - n, "{key}");
        }
    }
}

/// Batches of single checks under one policy and cost (the lean wire
/// formats: GCRA's own script, the windows' uniform mode): a key of another
/// type fails its own check only, and every other caller is decided as if
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clobbered_key_fails_alone_in_a_uniform_batch() {
    let server = RedisServer::start();
    let frozen = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = Arc::new(client_store(&server.url(), &frozen).await);
    let minute = Duration::from_secs(60);
    let policies = [
        ("gcra", Policy::cell(2, 1, minute).unwrap()), // 3 at once
        ("fixed", Policy::fixed_window(3, minute).unwrap()),
        ("sliding", Policy::sliding_window(3, minute).unwrap()),
        ("log", Policy::sliding_log(3, minute).unwrap()),
    ];
    for (name, policy) in policies {
        let key = |u: u64| format!("{name}:u{u}");
        let clobbered = store.redis_key(key(7).as_bytes(), &policy);
        let _: () = redis::cmd("LPUSH")
            .arg(&clobbered)
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let calls0 = evalsha_calls(&server);
        let mut foreign = 0;
        for round in 0..4u64 {
            let tasks: Vec<_> = (0..64)
                .map(|i| {
                    let (store, k) = (store.clone(), key(i % 16));
                    tokio::spawn(async move {
                        (
                            i % 16,
                            store.check(Charge::new(k.as_bytes(), &policy, 1)).await,
                        )
                    })
                })
                .collect();
            let mut admitted = [0u64; 16];
            for t in tasks {
                match t.await.unwrap() {
                    // Foreign data is repaired: one typed error, then a
                    // fresh key like every other.
                    (7, Err(StoreError::ForeignData { .. })) => foreign += 1,
                    (u, r) => admitted[u as usize] += u64::from(r.unwrap().allowed),
                }
            }
            for (u, &n) in admitted.iter().enumerate() {
                // 3 in the first round, none after: no time passes.
                let want = if round == 0 { 3 } else { 0 };
                assert_eq!(n, want, "{name}: user {u}, round {round}");
            }
        }
        assert_eq!(foreign, 1, "{name}");
        let calls = evalsha_calls(&server) - calls0;
        assert!(
            calls < 4 * 64,
            "{name}: {calls} script calls for 256 checks"
        );
    }
}

/// A caller that gives up while its check is still queued (behind a batch
/// stuck on a busy server) is never evaluated: nothing is charged for it.
#[test]
fn a_caller_giving_up_while_queued_is_never_counted() {
    // The busy script below counts CPU time on Valkey, which a loaded
    // machine stretches: no `BUSY` reply and no store timeout before it ends.
    let server = RedisServer::start_with_args(&["--busy-reply-threshold".into(), "60000".into()]);
    runtime().block_on(async {
        // A frozen clock: on the server's an hour boundary during the
        // test's 2.5 s would leave the final peek in a fresh window.
        let store = Arc::new(
            RedisStore::builder()
                .timeout(Duration::from_secs(60))
                .time_source(TimeSource::client(ManualClock::new()))
                .batches_in_flight(1)
                .deny_cache(0)
                .connect(server.url())
                .await
                .unwrap(),
        );
        let p = Policy::fixed_window(1000, Duration::from_secs(3600)).unwrap();
        // Keep the server busy for 2.5 s from another connection (generous, so
        // a loaded CI machine still queues every check below behind it).
        let busy = {
            let mut con = server.conn();
            std::thread::spawn(move || {
                // Valkey freezes TIME within a script, so there the loop
                // reads the CPU clock (`os.clock`, which Redis 7.0 lacks).
                let script = "local has, clock = pcall(function() return os.clock end) \
                    local function us() \
                      if has and clock then return clock() * 1000000 end \
                      local t = redis.call('TIME') return t[1] * 1000000 + t[2] \
                    end \
                    local t0 = us() \
                    for _ = 1, 1000000000 do \
                      if us() - t0 > 2500000 then break end \
                    end return 1";
                let _: i64 = redis::cmd("EVAL")
                    .arg(script)
                    .arg(0)
                    .query(&mut con)
                    .unwrap();
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The first check goes out at once and waits for the server...
        let first = {
            let store = store.clone();
            tokio::spawn(async move { store.check(Charge::new(b"q", &p, 1)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // ...so these queue behind it, and their callers give up.
        let mut gave_up = 0;
        for _ in 0..20 {
            let r = tokio::time::timeout(
                Duration::from_millis(20),
                store.check(Charge::new(b"q", &p, 1)),
            )
            .await;
            gave_up += u32::from(r.is_err());
        }
        assert_eq!(gave_up, 20);
        assert!(first.await.unwrap().allowed);
        busy.join().unwrap();
        let peek = store.check(Charge::new(b"q", &p, 0)).await.unwrap();
        assert_eq!(peek.remaining, 999, "only the first check was charged");
    });
}

#[test]
fn batching_off_decides_the_same() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = RedisStore::builder()
            .prefix("t")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
            .batching(false)
            .connect(server.url())
            .await
            .unwrap();
        let mem = memory(&clock);
        for (i, p) in five(3).into_iter().enumerate() {
            let key = format!("off{i}").into_bytes();
            for cost in [1, 2, 1, 0, 5] {
                let m = mem.check(Charge::new(&key, &p, cost)).await.unwrap();
                let r = store.check(Charge::new(&key, &p, cost)).await.unwrap();
                assert_eq!(no_permit(m), no_permit(r), "policy {i} cost {cost}");
                clock.advance(Duration::from_millis(700));
            }
        }
    });
}

// ---------------------------------------------------------- deny cache ---

/// Denials of a hot key are answered locally (fewer script calls than
/// checks) yet exactly as Redis and the memory store would answer them, and
/// the key is admitted again as soon as Redis would admit it.
#[test]
fn deny_cache_answers_like_redis_and_lets_go_in_time() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let policies = [
            Policy::cell(2, 1, Duration::from_secs(1)).unwrap(),
            Policy::fixed_window(3, Duration::from_secs(3)).unwrap(),
            Policy::sliding_window(3, Duration::from_secs(3)).unwrap(),
        ];
        for (i, p) in policies.iter().enumerate() {
            let key = format!("abuse{i}").into_bytes();
            let calls0 = evalsha_calls(&server);
            let mut checks = 0;
            for step in 0..400u64 {
                for cost in [1, 2, 1] {
                    let m = mem.check(Charge::new(&key, p, cost)).await.unwrap();
                    let r = store.check(Charge::new(&key, p, cost)).await.unwrap();
                    assert_eq!(m, r, "policy {i} step {step} cost {cost}");
                    checks += 1;
                }
                clock.advance(Duration::from_millis(10));
            }
            let calls = evalsha_calls(&server) - calls0;
            assert!(
                calls * 3 < checks,
                "policy {i}: {calls} calls for {checks} checks"
            );
        }
    });
}

/// Refund, reset and release drop the key's cached denial: the next check
/// is admitted at once.
#[test]
fn deny_cache_is_invalidated_by_refund_reset_and_release() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = client_store(&server.url(), &clock).await;
        let p = Policy::cell(1, 1, Duration::from_secs(3600)).unwrap();
        let k = b"inv";
        let fill = || async {
            while store.check(Charge::new(k, &p, 1)).await.unwrap().allowed {}
            assert!(!store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        };
        fill().await;
        assert_eq!(store.deny_cache_len(), 1);
        // A receipt of a unit taken now: its whole debt comes back.
        store
            .refund(k, &p, &Receipt::new(1, clock.now_ns(), None))
            .await
            .unwrap();
        assert_eq!(store.deny_cache_len(), 0);
        assert!(store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        fill().await;
        assert_eq!(store.deny_cache_len(), 1);
        store.reset(k, &p).await.unwrap();
        assert_eq!(store.deny_cache_len(), 0);
        assert!(store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);
        fill().await;
        store.release(k, &p, PermitId(1)).await.unwrap();
        // release does nothing for GCRA, and changes nothing in Redis either.
        assert!(!store.check(Charge::new(k, &p, 1)).await.unwrap().allowed);

        // Sliding log and concurrency denials are never cached.
        for p in [
            Policy::sliding_log(1, Duration::from_secs(60)).unwrap(),
            Policy::concurrency(1).unwrap(),
        ] {
            let d = store.check(Charge::new(b"nc", &p, 1)).await.unwrap();
            assert!(d.allowed);
            let before = store.deny_cache_len();
            assert!(
                !store
                    .check(Charge::new(b"nc", &p, 1))
                    .await
                    .unwrap()
                    .allowed
            );
            assert_eq!(store.deny_cache_len(), before);
            if let Some(id) = d.permit {
                store.release(b"nc", &p, id).await.unwrap();
                assert!(
                    store
                        .check(Charge::new(b"nc", &p, 1))
                        .await
                        .unwrap()
                        .allowed
                );
            }
        }
    });
}

/// On server time, many callers hammering a denied key never get more than
/// Redis admits, and the cache stays within its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_cache_never_admits_more_than_redis_and_is_bounded() {
    let server = RedisServer::start();
    let store = Arc::new(
        RedisStore::builder()
            .deny_cache(4)
            .connect(server.url())
            .await
            .unwrap(),
    );
    // 5 at once, then one every 100 ms.
    let p = Policy::cell(4, 10, Duration::from_secs(1)).unwrap();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..100_000 {
                    if t0.elapsed() > Duration::from_millis(800) {
                        break;
                    }
                    admitted += u64::from(
                        store
                            .check(Charge::new(b"hot", &p, 1))
                            .await
                            .unwrap()
                            .allowed,
                    );
                    tokio::task::yield_now().await;
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let elapsed = t0.elapsed();
    let bound = 5 + (elapsed.as_millis() as u64) / 100 + 1;
    assert!(
        admitted >= 5 && admitted <= bound,
        "{admitted} admitted in {elapsed:?}"
    );
    // Bounded: denials on many keys keep at most 4 entries.
    for i in 0..20 {
        let key = format!("k{i}").into_bytes();
        for _ in 0..6 {
            store.check(Charge::new(&key, &p, 1)).await.unwrap();
        }
        assert!(store.deny_cache_len() <= 4);
    }
}

/// redis-cell 0.5.0 computes `remaining` in whole microseconds: for
/// `cell(100, 853, 3 s)` (T = 3,516,998 ns), a cost of 2 at t = 0 then a peek
/// at t = T − 50 µs answers `[0, 101, 100, -1, 1]` from `CL.THROTTLE`, where
/// exact nanoseconds would give 99. Every store answers as redis-cell does.
#[test]
fn cell_remaining_is_redis_cells_to_the_bit() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = client_store(&server.url(), &clock).await;
        let mem = memory(&clock);
        let p = Policy::cell(100, 853, Duration::from_secs(3)).unwrap();
        let funnel = Policy::token_bucket(101, 853.0 / 3.0).unwrap();
        let stores: [&dyn DynCheck; 2] = [&mem, &redis];
        for (i, store) in stores.into_iter().enumerate() {
            let key = format!("c{i}");
            let rule = Charge::new(key.as_bytes(), &p, 2);
            assert_eq!(store.run(rule).await.to_cell_reply(), [0, 101, 99, -1, 1]);
            clock.advance(Duration::from_nanos(3_516_998 - 50_000));
            let peek = Charge::new(key.as_bytes(), &p, 0);
            assert_eq!(store.run(peek).await.to_cell_reply(), [0, 101, 100, -1, 1]);
            // The other GCRA constructors keep exact nanoseconds (T = 3,516,999).
            clock.advance(Duration::from_secs(60));
            let key = format!("f{i}");
            assert_eq!(
                store
                    .run(Charge::new(key.as_bytes(), &funnel, 2))
                    .await
                    .remaining,
                99
            );
            clock.advance(Duration::from_nanos(3_516_999 - 50_000));
            let peek = Charge::new(key.as_bytes(), &funnel, 0);
            assert_eq!(store.run(peek).await.remaining, 99);
            clock.advance(Duration::from_secs(60));
        }
    });
}

/// Object-safe `check` for iterating over stores of different types.
trait DynCheck {
    fn run<'a>(
        &'a self,
        rule: Charge<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>>;
}

impl<S: Store> DynCheck for S {
    fn run<'a>(
        &'a self,
        rule: Charge<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + 'a>> {
        Box::pin(async move { self.check(rule).await.unwrap() })
    }
}
