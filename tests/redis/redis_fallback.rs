//! The fallback store and lock-outs against a real `redis-server`.
//!
//! Fallback: two app instances (each its own Redis connection and its own
//! in-memory fallback) serve a fail-closed layer through a `BoxStore` while
//! the test kills Redis under load and starts it again. Asserted: no 503 at
//! all; the limit holds in every phase (each user gets 429s while Redis is
//! up, and while it is down); per user, Redis admits at most the limit per
//! server lifetime and each instance's fallback at most the limit (the
//! documented `instances × limit` bound while Redis is down); the fallback
//! decides only while Redis is down, and Redis decides again within a
//! second of being back.
//!
//! Budgets: a layer whose `store_timeout` is shorter than the Redis timeout
//! gets the fallback's decisions while Redis is frozen (SIGSTOP), not 503s.
//!
//! Real time on purpose: the server's death is the point.

use crate::faults;
use crate::redis_support;

use crate::decided_by;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use decided_by::handler;
use http::Request;
use redis_support::{current_thread_runtime, runtime, RedisServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::DecidedBy;
use tower_throttle::key::HeaderKey;
use tower_throttle::lockout::Penalty;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{BoxStore, FallbackStore, DEFAULT_PROBE_INTERVAL};
use tower_throttle::{FailMode, Limiter, MemoryStore, Policy, ThrottleLayer};

const TIMEOUT: Duration = Duration::from_millis(200);
const MARGIN: Duration = Duration::from_millis(300);
const INSTANCES: usize = 2;
const TASKS: usize = 4;
const USERS: usize = 3;
const BOUND: u64 = 30;
const PHASE: Duration = Duration::from_millis(1500);

/// One answered request: when (since the origin), which instance, user,
/// status, who decided an admitted one, and how long it took.
#[derive(Clone, Copy, Debug)]
struct Rec {
    at: Duration,
    took: Duration,
    instance: usize,
    user: usize,
    status: u16,
    by: Option<DecidedBy>,
}

#[test]
fn killing_redis_under_load_falls_back_without_503s_and_within_bounds() {
    let mut server = RedisServer::start();
    runtime().block_on(async {
        let origin = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        // Decisions on a frozen clock, in Redis and in the fallbacks: on
        // real clocks a day boundary mid-test would open a new fixed window
        // and admit twice the bound. The outage itself is real time.
        let clock = ManualClock::new();
        for instance in 0..INSTANCES {
            let redis = RedisStore::builder()
                .prefix("fb")
                .timeout(TIMEOUT)
                .time_source(TimeSource::client(clock.clone()))
                // Denied keys would otherwise be answered by the local
                // denial cache, whatever Redis's state: this test wants
                // every check to reach the store.
                .deny_cache(0)
                .connect(server.url())
                .await
                .unwrap();
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            let store =
                FallbackStore::new(redis, memory).probe_interval(Duration::from_millis(200));
            let layer = ThrottleLayer::new(
                BoxStore::new(store),
                Policy::fixed_window(BOUND, Duration::from_secs(86_400)).unwrap(),
            )
            .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
            .fail_mode(FailMode::Closed)
            .request_info(true);
            let svc = ServiceBuilder::new().layer(layer).service(handler());
            for task in 0..TASKS {
                let (svc, stop) = (svc.clone(), stop.clone());
                tasks.push(tokio::spawn(async move {
                    let mut recs = Vec::new();
                    let mut n = task;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let user = n % USERS;
                        let req = Request::builder()
                            .header("x-user", format!("user{user}"))
                            .body(())
                            .unwrap();
                        let start = origin.elapsed();
                        let res = svc.clone().oneshot(req).await.unwrap();
                        let by = res.headers().get("x-decided-by").map(|v| {
                            if v == "fallback" {
                                DecidedBy::Fallback
                            } else {
                                DecidedBy::Primary
                            }
                        });
                        recs.push(Rec {
                            at: start,
                            took: origin.elapsed() - start,
                            instance,
                            user,
                            status: res.status().as_u16(),
                            by,
                        });
                        // Pacing only, not synchronisation.
                        tokio::time::sleep(Duration::from_millis(3)).await;
                    }
                    recs
                }));
            }
        }
        tokio::time::sleep(PHASE).await;
        let killed = origin.elapsed();
        tokio::task::block_in_place(|| server.stop());
        tokio::time::sleep(PHASE).await;
        tokio::task::block_in_place(|| server.start_again());
        let back = origin.elapsed();
        tokio::time::sleep(PHASE).await;
        stop.store(true, Ordering::Relaxed);
        let mut recs = Vec::new();
        for t in tasks {
            recs.extend(t.await.expect("a load task panicked"));
        }
        check(&recs, killed, back);
    });
}

fn check(recs: &[Rec], killed: Duration, back: Duration) {
    let slowest = recs.iter().map(|r| r.took).max().unwrap();
    assert!(slowest <= TIMEOUT + MARGIN, "slowest request: {slowest:?}");
    let statuses: std::collections::BTreeSet<u16> = recs.iter().map(|r| r.status).collect();
    assert!(
        statuses.iter().all(|s| [200, 429].contains(s)),
        "statuses {statuses:?}"
    );
    let admitted = |pred: &dyn Fn(&Rec) -> bool| {
        recs.iter().filter(|r| r.status == 200 && pred(r)).count() as u64
    };
    for user in 0..USERS {
        // Redis admits at most the limit per server lifetime (the restart
        // loses its state: no persistence).
        let before =
            admitted(&|r| r.user == user && r.by == Some(DecidedBy::Primary) && r.at < killed);
        let after =
            admitted(&|r| r.user == user && r.by == Some(DecidedBy::Primary) && r.at >= back);
        assert_eq!(before, BOUND, "user {user}: Redis before the kill");
        assert!(
            after <= BOUND,
            "user {user}: Redis after the restart: {after}"
        );
        // Each instance's fallback admits at most the limit.
        for instance in 0..INSTANCES {
            let fb = admitted(&|r| {
                r.user == user && r.instance == instance && r.by == Some(DecidedBy::Fallback)
            });
            assert!(
                fb <= BOUND,
                "user {user}, instance {instance}: fallback {fb}"
            );
        }
        let fb_total = admitted(&|r| r.user == user && r.by == Some(DecidedBy::Fallback));
        assert!(
            fb_total > 0 && fb_total <= INSTANCES as u64 * BOUND,
            "user {user}: fallback admitted {fb_total}"
        );
        // Not an unlimited window: refusals while Redis is down too.
        let refused_down = recs
            .iter()
            .filter(|r| r.user == user && r.status == 429 && r.at > killed && r.at < back)
            .count();
        assert!(refused_down > 0, "user {user}: nothing refused while down");
    }
    // The fallback decides only around the outage, and Redis again within
    // a second of being back.
    let first_fallback = recs
        .iter()
        .filter(|r| r.by == Some(DecidedBy::Fallback))
        .map(|r| r.at)
        .min()
        .unwrap();
    assert!(
        first_fallback + MARGIN >= killed,
        "fallback before the kill"
    );
    let last_fallback = recs
        .iter()
        .filter(|r| r.by == Some(DecidedBy::Fallback))
        .map(|r| r.at)
        .max()
        .unwrap();
    assert!(
        last_fallback <= back + Duration::from_secs(1),
        "fallback {:?} after Redis came back",
        last_fallback - back
    );
}

/// A layer's `store_timeout(50ms)` under a Redis timeout of 200 ms: while
/// Redis is frozen the fallback answers within the layer's budget (the
/// primary gets part of it), so not one request is a 503; Redis decides
/// again once it runs.
#[test]
fn a_layer_timeout_shorter_than_redis_gets_the_fallback_during_a_stall() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let redis = RedisStore::builder()
            .prefix("budget")
            .timeout(TIMEOUT)
            .deny_cache(0)
            .connect(server.url())
            .await
            .unwrap();
        let store = FallbackStore::new(redis, MemoryStore::new());
        let layer = ThrottleLayer::new(
            store,
            Policy::fixed_window(100_000, Duration::from_secs(86_400)).unwrap(),
        )
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .fail_mode(FailMode::Closed)
        .store_timeout(Duration::from_millis(50))
        .request_info(true);
        let svc = ServiceBuilder::new().layer(layer).service(handler());
        let request = || async {
            let req = Request::builder().header("x-user", "u").body(()).unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            let by = res.headers().get("x-decided-by").cloned();
            (res.status().as_u16(), by)
        };
        let primary = http::HeaderValue::from_static("primary");
        let fallback = http::HeaderValue::from_static("fallback");
        assert_eq!(request().await, (200, Some(primary.clone())));

        let paused = tokio::task::block_in_place(|| faults::Paused::pause(&server));
        // Across two probe intervals, so stalled probes are answered too.
        let until = Instant::now() + 2 * DEFAULT_PROBE_INTERVAL;
        let mut stalled = Vec::new();
        while Instant::now() < until {
            stalled.push(request().await);
            // Pacing only, not synchronisation.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::task::block_in_place(|| paused.resume());
        assert!(stalled.len() > 10, "{} requests", stalled.len());
        let refused: Vec<_> = stalled.iter().filter(|(s, _)| *s != 200).collect();
        assert!(refused.is_empty(), "during the stall: {refused:?}");
        assert!(stalled.iter().all(|(_, by)| *by == Some(fallback.clone())));

        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, by) = request().await;
            assert_eq!(status, 200);
            if by == Some(primary.clone()) {
                break;
            }
            assert!(Instant::now() < deadline, "Redis did not decide again");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

#[test]
fn lockouts_hold_on_redis_with_the_remaining_lock_as_retry_after() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = RedisStore::builder()
            .prefix("lk")
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap();
        let min = Duration::from_secs(60);
        let l = Limiter::new(store, Policy::sliding_log(2, min).unwrap())
            .lockout(Penalty::new(3, 10 * min, 5 * min).unwrap())
            .with_prefix("login");
        assert!(l.check("u").await.unwrap().allowed);
        assert!(l.check("u").await.unwrap().allowed);
        assert_eq!(l.check("u").await.unwrap().retry_after, Some(min));
        assert!(!l.check("u").await.unwrap().allowed);
        let locked = l.check("u").await.unwrap();
        assert_eq!(locked.retry_after, Some(5 * min));
        clock.advance(2 * min);
        let d = l.check("u").await.unwrap();
        assert_eq!((d.allowed, d.retry_after_secs()), (false, Some(180)));
        assert!(l.check("other").await.unwrap().allowed);
        clock.advance(3 * min);
        assert_eq!(l.locked_for("u").await.unwrap(), None);
        assert!(
            l.check("u").await.unwrap().allowed,
            "unlocked, and not charged while locked"
        );
        assert!(l.check("u").await.unwrap().allowed);
    });
}
