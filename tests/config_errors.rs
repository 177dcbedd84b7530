//! Configuration a store cannot run is refused when the limiter or the
//! layer's service is built, never per request (feature `redis`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use tower::Layer;
use tower_throttle::store::redis::{HashTag, RedisStore};
use tower_throttle::{Limit, Limiter, MemoryStore, Policy, Store, StoreError, ThrottleLayer};

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
        .and(Limit::new("log", big));
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
        // Shorter than the server clock's µs: the window index would not be
        // exact in Lua's doubles.
        Policy::fixed_window(1, Duration::from_nanos(999)).unwrap(),
        Policy::sliding_window(1 << 40, Duration::from_secs(3600)).unwrap(),
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
}

#[test]
fn rules_that_cannot_share_a_cluster_slot_are_refused_at_build() {
    let day = Limit::new(
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
    let spec = tower_throttle::RuleSpec::new(&big, b"");
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
        ThrottleLayer::new(GovernorStore::new(), minute()).and(Limit::new("second", minute()));
    assert!(layer.validate().is_err());
    assert!(Limiter::try_new(GovernorStore::new(), minute()).is_ok());
}
