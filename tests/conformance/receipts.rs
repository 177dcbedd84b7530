//! Receipts: a charge given back lands in the slot it was taken from, on
//! every store. The property: for any interleaving of charges, refunds (of
//! any charge still held, whole or in part) and window boundaries under a
//! manual clock, no window admits more than its limit of counted requests
//! (a request is counted unless it was refunded). Run on the memory store,
//! a `BoxStore`, a `FallbackStore`, Redis and Redis Cluster (client clock).

use crate::redis_support;

use std::time::Duration;

use proptest::prelude::*;
use redis_support::{current_thread_runtime, RedisCluster, RedisServer};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::Receipt;
use tower_throttle::policy::Algorithm;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::store::{BoxStore, FallbackStore};
use tower_throttle::{MemoryStore, Policy, Store};

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Charge(u64),
    /// Gives back `n` units of the `i`-th charge with units still held: a
    /// receipt is settled once, or in parts adding up to its units.
    Refund(usize, u64),
}

/// One admitted charge: when, how many units, its receipt, how many given back.
struct Admitted {
    at: u64,
    units: u64,
    receipt: Receipt,
    refunded: u64,
}

fn ops(window_us: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..=window_us / 4).prop_map(Op::Advance),
        1 => (0..=window_us * 2).prop_map(Op::Advance),
        6 => (1..=3u64).prop_map(Op::Charge),
        4 => (any::<usize>(), 1..=2u64).prop_map(|(i, n)| Op::Refund(i, n)),
    ];
    proptest::collection::vec(op, 1..=60)
}

/// A limit of 3 per 10 ms in each algorithm that counts requests.
fn policies() -> Vec<Policy> {
    let w = Duration::from_millis(10);
    vec![
        Policy::fixed_window(3, w).unwrap(),
        Policy::sliding_window(3, w).unwrap(),
        Policy::sliding_log(3, w).unwrap(),
        // limit 3, one unit back every 10/3 ms.
        Policy::cell(2, 3, w).unwrap(),
    ]
}

/// Runs `ops` on `key` and checks the property on every admission.
async fn walk<S: Store>(
    store: &S,
    clock: &ManualClock,
    key: &[u8],
    policy: &Policy,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut admitted: Vec<Admitted> = Vec::new();
    for op in ops {
        match *op {
            Op::Advance(us) => clock.advance(Duration::from_micros(us)),
            Op::Charge(cost) => {
                let d = store.check(Charge::new(key, policy, cost)).await.unwrap();
                if d.allowed {
                    let receipt = d.receipt().expect("an admitted charge has a receipt");
                    prop_assert_eq!(receipt.units(), cost);
                    admitted.push(Admitted {
                        at: clock.now_ns(),
                        units: cost,
                        receipt,
                        refunded: 0,
                    });
                    within_limit(policy, &admitted)?;
                }
            }
            Op::Refund(i, n) => {
                let held: Vec<usize> = (0..admitted.len())
                    .filter(|&j| admitted[j].refunded < admitted[j].units)
                    .collect();
                if held.is_empty() {
                    continue;
                }
                let a = &mut admitted[held[i % held.len()]];
                let n = n.min(a.units - a.refunded);
                store.refund(key, policy, &a.receipt.part(n)).await.unwrap();
                a.refunded += n;
            }
        }
    }
    Ok(())
}

/// No window holds more than the limit of counted units.
fn within_limit(policy: &Policy, admitted: &[Admitted]) -> Result<(), TestCaseError> {
    let counted = |a: &Admitted| a.units - a.refunded;
    let last = admitted.last().unwrap().at;
    match policy.algorithm() {
        // Aligned windows: a sliding window's current count never passes
        // the limit either (its estimate is at least that count).
        Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) => {
            let window = last / p.window_ns;
            let n: u64 = (admitted.iter())
                .filter(|a| a.at / p.window_ns == window)
                .map(counted)
                .sum();
            prop_assert!(n <= p.max, "{} counted in window {}", n, window);
        }
        Algorithm::SlidingLog(p) => {
            let n: u64 = (admitted.iter())
                .filter(|a| a.at + p.window_ns > last)
                .map(counted)
                .sum();
            prop_assert!(n <= p.max, "{} counted in the window up to {}", n, last);
        }
        // GCRA: n units in [a, b] need b − a ≥ (n − limit)·T.
        Algorithm::Gcra(p) => {
            for first in admitted {
                let n: u64 = (admitted.iter())
                    .filter(|a| a.at >= first.at)
                    .map(counted)
                    .sum();
                let bound = p.limit + (last - first.at) / p.emission_interval_ns;
                prop_assert!(
                    n <= bound,
                    "{} counted since {}, bound {}",
                    n,
                    first.at,
                    bound
                );
            }
        }
        other => unreachable!("{other:?}"),
    }
    Ok(())
}

fn manual_memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A key of its own for each case run on a shared server.
fn case_key(case: &std::sync::atomic::AtomicU64) -> Vec<u8> {
    let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("case-{n}").into_bytes()
}

#[test]
fn memory_boxed_and_fallback_stores_never_admit_more_than_the_limit() {
    let rt = current_thread_runtime();
    for policy in policies() {
        proptest!(config(200), |(ops in ops(10_000))| {
            let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
            rt.block_on(async {
                walk(&manual_memory(&clock), &clock, b"k", &policy, &ops).await?;
                let boxed = BoxStore::new(manual_memory(&clock));
                walk(&boxed, &clock, b"k", &policy, &ops).await?;
                let pair = FallbackStore::new(manual_memory(&clock), manual_memory(&clock));
                walk(&pair, &clock, b"k", &policy, &ops).await
            })?;
        });
    }
}

#[test]
fn redis_never_admits_more_than_the_limit() {
    let server = RedisServer::start();
    let rt = current_thread_runtime();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = rt.block_on(client_clock(&clock, |b| b.connect(server.url())));
    let case = std::sync::atomic::AtomicU64::new(0);
    for policy in policies() {
        proptest!(config(64), |(ops in ops(10_000))| {
            let key = case_key(&case);
            rt.block_on(walk(&store, &clock, &key, &policy, &ops))?;
        });
    }
}

#[test]
fn redis_cluster_never_admits_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let rt = current_thread_runtime();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = rt.block_on(client_clock(&clock, |b| b.connect_cluster(cluster.urls())));
    let case = std::sync::atomic::AtomicU64::new(0);
    for policy in policies() {
        proptest!(config(32), |(ops in ops(10_000))| {
            let key = case_key(&case);
            rt.block_on(walk(&store, &clock, &key, &policy, &ops))?;
        });
    }
}

/// A Redis store on `clock`, whose keys outlive any real time the test takes.
async fn client_clock<S, F>(
    clock: &ManualClock,
    connect: impl FnOnce(tower_throttle::store::redis::RedisStoreBuilder) -> F,
) -> S
where
    F: std::future::Future<Output = Result<S, tower_throttle::StoreError>>,
{
    let builder = RedisStore::builder()
        .prefix("receipts")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600));
    connect(builder).await.unwrap()
}

/// Two clocks at a window boundary (another process's clock ahead, or its
/// call first): a charge made at an instant before the key's stored window
/// counts in that window, so its receipt must name that window and a
/// refund must give the units back there (a receipt naming the instant's
/// window is ignored: the units stay lost). Fixed and sliding windows.
async fn refund_behind_the_stored_window<S: Store>(store: &S, clock: &ManualClock, key: &[u8]) {
    const W: u64 = 10_000_000_000;
    for (name, policy) in [
        (
            "fixed",
            Policy::fixed_window(5, Duration::from_nanos(W)).unwrap(),
        ),
        (
            "sliding",
            Policy::sliding_window(5, Duration::from_nanos(W)).unwrap(),
        ),
    ] {
        let key = [key, name.as_bytes()].concat();
        let start = clock.now_ns() / W * W + 2 * W;
        clock.set_ns(start + W);
        assert!(
            store
                .check(Charge::new(&key, &policy, 1))
                .await
                .unwrap()
                .allowed
        );
        clock.set_ns(start + W - 100_000_000);
        let behind = store.check(Charge::new(&key, &policy, 3)).await.unwrap();
        assert!(behind.allowed, "{name}");
        let receipt = behind.receipt().unwrap();
        assert_eq!(
            receipt.at_ns(),
            start + W,
            "{name}: the window it counted in"
        );
        store.refund(&key, &policy, &receipt).await.unwrap();
        clock.set_ns(start + W + 100_000_000);
        let peek = store.check(Charge::new(&key, &policy, 0)).await.unwrap();
        assert_eq!(peek.remaining, 4, "{name}: the 3 units are back");
    }
}

#[tokio::test]
async fn a_charge_behind_the_stored_window_is_refunded_into_it() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    refund_behind_the_stored_window(&manual_memory(&clock), &clock, b"m").await;
    let boxed = BoxStore::new(manual_memory(&clock));
    refund_behind_the_stored_window(&boxed, &clock, b"b").await;
    let pair = FallbackStore::new(manual_memory(&clock), manual_memory(&clock));
    refund_behind_the_stored_window(&pair, &clock, b"f").await;
    let server = RedisServer::start();
    let redis = client_clock(&clock, |b| b.connect(server.url())).await;
    refund_behind_the_stored_window(&redis, &clock, b"r").await;
    let cluster = RedisCluster::start();
    let redis = client_clock(&clock, |b| b.connect_cluster(cluster.urls())).await;
    refund_behind_the_stored_window(&redis, &clock, b"c").await;
}

/// The attack on `count_if`: requests that will not count (a 200) are
/// charged at the end of one window and answered in the next. Their
/// refunds must go to the window that charged them (which has ended: they
/// change nothing), not to the next one, whose failed logins they would
/// otherwise let through twice over.
#[tokio::test]
async fn count_if_refunds_land_in_the_window_that_charged_them() {
    let clock = ManualClock::starting_at(9_900_000_000); // 9.9 s: window 0 of 10 s
    let failed = guesses_after_slow_successes(
        &clock,
        Policy::fixed_window(5, Duration::from_secs(10)).unwrap(),
        Duration::from_millis(100), // the successes are answered at 10 s
        &[Duration::ZERO],
    )
    .await;
    assert_eq!(failed, 5, "failed logins admitted in window 1, limit 5");
}

/// The same on a sliding log: refunds take back the successes' own
/// entries, not the newest ones (the failed logins').
#[tokio::test]
async fn count_if_refunds_take_back_their_own_log_entries() {
    let clock = ManualClock::starting_at(1_000_000_000);
    let failed = guesses_after_slow_successes(
        &clock,
        Policy::sliding_log(5, Duration::from_secs(10)).unwrap(),
        Duration::from_secs(5),
        // More guesses at 5 s, then at 10 s when the successes' entries
        // (had they stayed) would have left the window.
        &[Duration::ZERO, Duration::from_secs(5)],
    )
    .await;
    assert_eq!(failed, 5, "failed logins admitted within 10 s, limit 5");
}

/// Sends 2 requests that succeed but are answered only after `slow`; then
/// failed logins (401) until refused; then the successes' answers (their
/// refunds); then failed logins until refused again at each of `later`
/// after that (cumulative). Returns how many failed logins were admitted.
async fn guesses_after_slow_successes(
    clock: &ManualClock,
    policy: Policy,
    slow: Duration,
    later: &[Duration],
) -> usize {
    use http::{Request, Response, StatusCode};
    use std::sync::Arc;
    use tokio::sync::Notify;
    use tower::{Layer, Service, ServiceExt};
    use tower_throttle::key::Global;
    use tower_throttle::ThrottleLayer;

    let answer = Arc::new(Notify::new());
    let gate = answer.clone();
    let inner = tower::service_fn(move |req: Request<()>| {
        let gate = gate.clone();
        async move {
            let mut response = Response::new(http_body_util::Full::new(bytes::Bytes::new()));
            if req.uri().path() == "/ok" {
                gate.notified().await;
            } else {
                *response.status_mut() = StatusCode::UNAUTHORIZED;
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let mut svc = ThrottleLayer::new(manual_memory(clock), policy)
        .key(Global)
        .count_if(|s| s == StatusCode::UNAUTHORIZED)
        .layer(inner);
    let get = |path: &str| Request::builder().uri(path).body(()).unwrap();
    // Charged now (the in-process check runs in `call`), answered later.
    let mut slow_calls = Vec::new();
    for _ in 0..2 {
        svc.ready().await.unwrap();
        slow_calls.push(tokio::spawn(svc.call(get("/ok"))));
    }
    clock.advance(slow);
    let mut failed = 0;
    macro_rules! guess_until_refused {
        () => {
            loop {
                let response = svc
                    .ready()
                    .await
                    .unwrap()
                    .call(get("/login"))
                    .await
                    .unwrap();
                if response.status() != StatusCode::UNAUTHORIZED {
                    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                    break;
                }
                failed += 1;
                assert!(failed < 100, "no limit at all");
            }
        };
    }
    guess_until_refused!();
    // Each slow call waits for its own wake-up: answer them one by one.
    for call in slow_calls {
        answer.notify_one();
        let response = call.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    for &wait in later {
        clock.advance(wait);
        guess_until_refused!();
    }
    failed
}
