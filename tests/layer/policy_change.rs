//! What a key's state becomes when its policy changes (a customer upgraded
//! mid-window), per algorithm, identically on the memory and Redis stores.
//! The rules are in `tower_throttle::resolve`.

use crate::redis_support;

use std::time::Duration;

use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::{Limiter, MemoryStore, Policy, Store};

const MIN: Duration = Duration::from_secs(60);

/// `n` checks of `policy`; returns how many were admitted.
async fn admit<S: Store>(l: &Limiter<S>, key: &str, policy: &Policy, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(l.check_with(key, policy, 1).await.unwrap().allowed);
    }
    admitted
}

/// Every algorithm's rule, on one store; `free` is the limiter's own policy.
async fn semantics<S: Store>(store: S) {
    let store = std::sync::Arc::new(store);
    let limiter = |p: Policy| Limiter::from_shared(store.clone(), p);

    // Counting algorithms, same window: the units counted carry over and
    // the new maximum applies to them.
    for (free, premium) in [
        (
            Policy::sliding_log(5, MIN).unwrap(),
            Policy::sliding_log(50, MIN).unwrap(),
        ),
        (
            Policy::fixed_window(5, MIN).unwrap(),
            Policy::fixed_window(50, MIN).unwrap(),
        ),
        (
            Policy::sliding_window(5, MIN).unwrap(),
            Policy::sliding_window(50, MIN).unwrap(),
        ),
    ] {
        let l = limiter(free).with_prefix(&format!("{:?}", free.algorithm()).as_bytes()[..6]);
        assert_eq!(admit(&l, "u", &free, 6).await, 5, "{free:?}");
        // Upgraded: 5 of 50 used.
        let d = l.check_with("u", &premium, 1).await.unwrap();
        assert!(d.allowed, "{premium:?}");
        assert_eq!(d.remaining, 44, "{premium:?}: the 5 free units still count");
        assert_eq!(admit(&l, "u", &premium, 50).await, 44);
        // Downgraded again: 50 used, the free maximum is 5: refused.
        assert!(!l.check_with("u", &free, 1).await.unwrap().allowed);
    }

    // Sliding log, another window: the same instants, judged by the new one.
    let free = Policy::sliding_log(5, MIN).unwrap();
    let l = limiter(free).with_prefix("log-w");
    assert_eq!(admit(&l, "u", &free, 5).await, 5);
    let hourly = Policy::sliding_log(8, Duration::from_secs(3600)).unwrap();
    assert_eq!(admit(&l, "u", &hourly, 5).await, 3, "5 of 8 were used");

    // GCRA: the debt (a time) carries over, so the fraction of the burst
    // used does: 5 of 5 free is 50 of 50 premium (same 60 s window), and
    // the premium rate pays it back ten times faster.
    let free = Policy::cell(4, 5, MIN).unwrap();
    let premium = Policy::cell(49, 50, MIN).unwrap();
    let l = limiter(free).with_prefix("gcra");
    assert_eq!(admit(&l, "u", &free, 6).await, 5);
    let d = l.check_with("u", &premium, 1).await.unwrap();
    assert!(!d.allowed);
    assert_eq!(d.limit, 50);
    assert!(
        d.retry_after.unwrap() <= Duration::from_millis(1200),
        "one premium interval, not a free one: {d:?}"
    );
    // A half-used premium burst is a half-used free one.
    let l = limiter(free).with_prefix("gcra2");
    assert_eq!(admit(&l, "u", &premium, 25).await, 25);
    assert_eq!(l.check_with("u", &free, 0).await.unwrap().remaining, 2);

    // Concurrency: the requests in flight count against the new maximum.
    let free = Policy::concurrency(2).unwrap();
    let l = limiter(free).with_prefix("conc");
    assert_eq!(admit(&l, "u", &free, 3).await, 2);
    assert_eq!(admit(&l, "u", &Policy::concurrency(5).unwrap(), 5).await, 3);

    // Windows of another length, or another algorithm: a separate state.
    let free = Policy::fixed_window(5, MIN).unwrap();
    let l = limiter(free).with_prefix("fw-len");
    assert_eq!(admit(&l, "u", &free, 6).await, 5);
    let hourly = Policy::fixed_window(100, Duration::from_secs(3600)).unwrap();
    assert_eq!(
        l.check_with("u", &hourly, 1).await.unwrap().remaining,
        99,
        "fresh"
    );
    assert!(
        !l.check_with("u", &free, 1).await.unwrap().allowed,
        "the free state is where it was left"
    );
    let gcra = Policy::cell(9, 10, MIN).unwrap();
    assert_eq!(admit(&l, "u", &gcra, 11).await, 10, "fresh");
}

#[test]
fn policy_changes_on_the_memory_store() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock)
        .sweep_interval(None)
        .build();
    runtime().block_on(semantics(store));
}

#[test]
fn policy_changes_on_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    runtime().block_on(async {
        // The clock stands still while real time runs down the keys' TTLs
        // (a premium GCRA key holding one unit lives 2 s): padded, so a
        // stalled machine never sees state the clock still holds expire.
        let store = RedisStore::builder()
            .prefix("pc")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
            .connect(server.url().as_str())
            .await
            .unwrap();
        semantics(store).await;
    });
}
