//! Coalesced checks: exact bounds in order, mixed batches, a clobbered key failing alone, callers giving up, batching off.

use crate::redis_support;

use std::sync::Arc;
use std::time::Duration;

use super::{client_store, evalsha_calls, five, memory, no_permit};
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store, StoreError};

// ------------------------------------------------------------- batching ---

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
