//! Configuration a store cannot run is refused when the limiter or the
//! layer's service is built, never per request (feature `redis`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tower::Layer;
use tower_throttle::store::redis::{HashTag, RedisStore};
use tower_throttle::{Limiter, MemoryStore, Policy, Rule, Store, StoreError, ThrottleLayer};

/// A connection that is never used: validation needs no server.
#[derive(Clone)]
struct NoServer;

impl ConnectionLike for NoServer {
    fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async { panic!("validation must not talk to Redis") })
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { panic!("validation must not talk to Redis") })
    }
    fn get_db(&self) -> i64 {
        0
    }
}

fn redis(cluster: bool, tag: HashTag) -> RedisStore<NoServer> {
    RedisStore::builder()
        .hash_tag(tag)
        .build(NoServer, cluster)
        .unwrap()
}

fn panic_text(f: impl FnOnce()) -> String {
    let err = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn minute() -> Policy {
    Policy::cell(10, 10, Duration::from_secs(60)).unwrap()
}

#[test]
fn sliding_log_above_the_redis_cap_is_refused_at_build() {
    let big = Policy::sliding_log(20_000, Duration::from_secs(60)).unwrap();
    let err = Limiter::try_new(redis(false, HashTag::PerKey), big).unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("sliding_window"), "{err}");
    let text = panic_text(|| drop(Limiter::new(redis(false, HashTag::PerKey), big)));
    assert!(
        text.contains("SlidingLog") && text.contains("sliding_window"),
        "{text}"
    );

    let layer = ThrottleLayer::new(redis(false, HashTag::PerKey), minute())
        .name("minute")
        .and(Rule::new("log", big));
    let err = layer.validate().unwrap_err();
    assert_eq!(err.rules().collect::<Vec<_>>(), ["log"]);
    assert_eq!(err.policy(), Some(&big));
    let text = panic_text(|| drop(layer.layer(())));
    assert!(text.contains("rule `log`"), "{text}");
    assert!(text.contains("Policy::sliding_window"), "{text}");
    // The cap itself runs, and the memory store has no cap.
    let at_cap = Policy::sliding_log(10_000, Duration::from_secs(60)).unwrap();
    assert!(Limiter::try_new(redis(false, HashTag::PerKey), at_cap).is_ok());
    assert!(Limiter::try_new(MemoryStore::new(), big).is_ok());
    assert!(ThrottleLayer::new(MemoryStore::new(), big)
        .validate()
        .is_ok());
}

#[test]
fn policies_outside_the_exact_range_are_refused_at_build() {
    for p in [
        // Beyond 2^50 µs (35 years) or a count of 2^50: far outside issue
        // 11's bounds, where the scripts' doubles would no longer be exact.
        Policy::fixed_window(1, Duration::from_secs(40 * 365 * 86_400)).unwrap(),
        Policy::sliding_window((1 << 50) + 1, Duration::from_secs(3600)).unwrap(),
        // A GCRA tolerance (interval × limit) of 1000·2^42 ns (50.9 days)
        // or more: Redis keeps tats in ns modulo twice that.
        Policy::cell(0, 1, Duration::from_nanos(1000 << 42)).unwrap(),
        Policy::cell(1, 1, Duration::from_secs(30 * 86_400)).unwrap(),
    ] {
        let err = Limiter::try_new(redis(false, HashTag::PerKey), p).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        let layer = ThrottleLayer::new(redis(false, HashTag::PerKey), p);
        let text = panic_text(|| drop(layer.layer(())));
        assert!(
            text.contains("rule `default`") && text.contains("on Redis"),
            "{text}"
        );
        assert!(Limiter::try_new(MemoryStore::new(), p).is_ok());
    }
    // Just below: 5 a month, and one per 50 days.
    for p in [
        Policy::cell(4, 5, Duration::from_secs(30 * 86_400)).unwrap(),
        Policy::cell(0, 1, Duration::from_nanos((1000 << 42) - 1)).unwrap(),
    ] {
        assert!(Limiter::try_new(redis(false, HashTag::PerKey), p).is_ok());
    }
}

#[test]
fn rules_that_cannot_share_a_cluster_slot_are_refused_at_build() {
    let day = Rule::new(
        "day",
        Policy::fixed_window(100, Duration::from_secs(86_400)).unwrap(),
    );
    let two = |store| {
        ThrottleLayer::new(store, minute())
            .name("minute")
            .and(day.clone())
    };
    // PerKey spreads the rules of one request over slots: refused, with the fix.
    let layer = two(redis(true, HashTag::PerKey));
    let err = layer.validate().unwrap_err();
    assert_eq!(err.rules().collect::<Vec<_>>(), ["minute", "day"]);
    assert!(
        matches!(err.store_error(), StoreError::Config(_)),
        "{err:?}"
    );
    let text = panic_text(|| drop(layer.layer(())));
    assert!(text.contains("HashTag::AfterFirst(b':')"), "{text}");
    // The suggested fix passes; a layer prefix defeats it, so Fixed is named.
    two(redis(true, HashTag::AfterFirst(b':'))).layer(());
    let prefixed = two(redis(true, HashTag::AfterFirst(b':'))).prefix("reply");
    let text = panic_text(|| drop(prefixed.layer(())));
    assert!(text.contains("HashTag::Fixed"), "{text}");
    two(redis(true, HashTag::Fixed("app".into())))
        .prefix("reply")
        .layer(());
    // A single server takes any rules; one rule is one slot.
    two(redis(false, HashTag::PerKey)).layer(());
    ThrottleLayer::new(redis(true, HashTag::PerKey), minute()).layer(());
}

#[test]
fn validation_is_forwarded_through_arc() {
    let big = Policy::sliding_log(20_000, Duration::from_secs(60)).unwrap();
    let store = std::sync::Arc::new(redis(false, HashTag::PerKey));
    let spec = tower_throttle::store::RuleSpec::new(&big, b"");
    assert!(Store::validate(&store, &[spec]).is_err());
    assert!(Limiter::try_from_shared(store, big).is_err());
}

#[cfg(feature = "governor")]
#[test]
fn governor_refuses_what_it_cannot_run_at_build() {
    use tower_throttle::store::GovernorStore;
    let log = Policy::sliding_log(5, Duration::from_secs(1)).unwrap();
    let err = Limiter::try_new(GovernorStore::new(), log).unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    let layer =
        ThrottleLayer::new(GovernorStore::new(), minute()).and(Rule::new("second", minute()));
    assert!(layer.validate().is_err());
    assert!(Limiter::try_new(GovernorStore::new(), minute()).is_ok());
}

/// `BoxStore` and `FallbackStore` ask the stores they wrap: a policy one of
/// them cannot run is refused at build, not on every request.
#[test]
fn validation_is_forwarded_through_box_store_and_fallback_store() {
    use tower_throttle::store::{BoxStore, FallbackStore};
    let big = Policy::sliding_log(20_000, Duration::from_secs(60)).unwrap();
    let boxed = BoxStore::new(redis(false, HashTag::PerKey));
    let err = Limiter::try_new(boxed, big).unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    let layer = ThrottleLayer::new(BoxStore::new(redis(false, HashTag::PerKey)), big);
    assert!(layer.validate().is_err());
    assert!(Limiter::try_new(BoxStore::new(redis(false, HashTag::PerKey)), minute()).is_ok());
    // Either side of a fallback may decide: both must run the rules.
    let on_redis = FallbackStore::new(redis(false, HashTag::PerKey), MemoryStore::new());
    assert!(Limiter::try_new(on_redis, big).is_err());
    let on_memory = FallbackStore::new(MemoryStore::new(), redis(false, HashTag::PerKey));
    assert!(Limiter::try_new(on_memory, big).is_err());
    let fine = FallbackStore::new(redis(false, HashTag::PerKey), MemoryStore::new());
    assert!(Limiter::try_new(fine, minute()).is_ok());
}

/// A lock-out keeps its strikes in a sliding log and its locks in a GCRA
/// key of the layer's store: a store that cannot is refused at build.
#[cfg(feature = "governor")]
#[test]
fn a_lockout_on_a_store_that_cannot_keep_strikes_is_refused_at_build() {
    use tower_throttle::lockout::Penalty;
    use tower_throttle::store::GovernorStore;
    let penalty = Penalty::new(3, Duration::from_secs(600), Duration::from_secs(300)).unwrap();
    let layer = ThrottleLayer::new(GovernorStore::new(), minute()).lockout(penalty.clone());
    let err = layer.validate().unwrap_err();
    assert_eq!(err.rules().collect::<Vec<_>>(), ["lockout"]);
    assert_eq!(err.policy(), Some(penalty.strikes_policy()));
    assert!(
        matches!(err.store_error(), StoreError::Unsupported(_)),
        "{err}"
    );
    let text =
        panic_text(|| drop(layer.layer(tower::service_fn(|_: ()| async { Ok::<_, ()>(()) }))));
    assert!(text.contains("lockout"), "{text}");
    // Without the lock-out the same layer builds; on Redis both do.
    assert!(ThrottleLayer::new(GovernorStore::new(), minute())
        .validate()
        .is_ok());
    let on_redis = ThrottleLayer::new(redis(false, HashTag::PerKey), minute()).lockout(penalty);
    assert!(on_redis.validate().is_ok());
}

/// Issue 11's bounds: counts 1–10^6 (10,000 for logs, their Redis cap) and
/// periods from 1 ns to a year, whole µs or not. Sampled: every period
/// below 2 µs, then a geometric walk with odd offsets, and a year ± 1 ns.
fn periods_ns() -> Vec<u64> {
    let year = 365 * 86_400 * 1_000_000_000u64;
    let mut out: Vec<u64> = (1..=2_000).collect();
    let mut p = 2_000u64;
    while p < year {
        out.extend([p, p + 1, p + 333, p / 3 * 3 + 1]);
        p = p * 17 / 10;
    }
    out.extend([year - 1, year, year + 1, year / 7, 60_000_000_000 / 7]);
    out
}

fn refused(policy: &Policy) -> bool {
    let store = redis(false, HashTag::PerKey);
    store
        .validate(&[tower_throttle::store::RuleSpec::new(policy, b"k:")])
        .is_err()
}

#[test]
fn no_window_log_or_lease_within_the_bounds_is_refused_on_redis() {
    let mut out = Vec::new();
    for ns in periods_ns() {
        let d = Duration::from_nanos(ns);
        for count in [1, 7, 999, 10_000] {
            let log = Policy::sliding_log(count, d).unwrap();
            if refused(&log) {
                out.push(("log", count, ns));
            }
        }
        for count in [1, 7, 999, 10_000, 1_000_000] {
            let lease = Policy::concurrency_with_lease(count, d).unwrap();
            if refused(&lease) {
                out.push(("lease", count, ns));
            }
            let fixed = Policy::fixed_window(count, d).unwrap();
            if refused(&fixed) {
                out.push(("fixed", count, ns));
            }
            let sliding = Policy::sliding_window(count, d).unwrap();
            if refused(&sliding) {
                out.push(("sliding", count, ns));
            }
        }
    }
    assert_eq!(out, []);
}

/// Nothing within the bounds is refused any more; what Redis refuses lies
/// beyond them, each a typed `Unsupported` error naming Redis: windows,
/// logs and leases above 2^50 µs (35 years; durations are exact (µs, ns)
/// pairs of doubles), and limits above 2^50 (counts are doubles).
#[test]
fn what_redis_refuses_lies_beyond_the_bounds() {
    let store = redis(false, HashTag::PerKey);
    let beyond = Duration::from_micros((1 << 50) + 1);
    let specs = [
        Policy::fixed_window(1, beyond).unwrap(),
        Policy::sliding_window(1, beyond + Duration::from_nanos(1)).unwrap(),
        Policy::sliding_log(1, beyond).unwrap(),
        Policy::concurrency_with_lease(1, beyond + Duration::from_nanos(1)).unwrap(),
        Policy::fixed_window((1 << 50) + 1, Duration::from_nanos(1)).unwrap(),
        Policy::sliding_window((1 << 50) + 1, Duration::from_secs(1)).unwrap(),
    ];
    for p in &specs {
        let err = store
            .validate(&[tower_throttle::store::RuleSpec::new(p, b"k:")])
            .unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{p:?}: {err:?}");
        assert!(err.to_string().contains("Redis"), "{err}");
    }
    // Just inside: 2^50 µs and counts of 2^50 run.
    let edge = Duration::from_micros(1 << 50);
    for p in [
        Policy::fixed_window(1 << 50, edge).unwrap(),
        Policy::sliding_window(1 << 50, edge).unwrap(),
        Policy::sliding_window(1 << 50, edge + Duration::from_nanos(999)).unwrap(),
    ] {
        assert!(!refused(&p), "{p:?}");
    }
}
