//! Lock-outs where they meet other features: a lock announced is enforced
//! for its whole duration in a full memory store and across a fallback
//! switch (both ways), and a rule whose key every client shares collects no
//! strikes, so one client's denials never lock out another (memory and
//! Redis, through the layer).

use crate::redis_support;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Empty;
use redis_support::{current_thread_runtime, RedisServer};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::DecidedBy;
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::lockout::Penalty;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::store::FallbackStore;
use tower_throttle::{Limiter, MemoryStore, Policy, Rule, Store, ThrottleLayer};

const WINDOW: Duration = Duration::from_secs(10);
const LOCK: Duration = Duration::from_secs(600);

/// 2 attempts per 10 s; 2 denials within a minute lock the key for 600 s.
fn login_policy() -> Policy {
    Policy::sliding_log(2, WINDOW).unwrap()
}

fn penalty() -> Penalty {
    Penalty::new(2, Duration::from_secs(60), LOCK).unwrap()
}

/// A store of 4 keys, all held by other clients for an hour.
fn full_store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .shards(1)
        .max_keys(4)
        .evict_when_full(false)
        .overflow_buckets(1)
        .build();
    let long = Policy::sliding_log(1_000, Duration::from_secs(3600)).unwrap();
    for i in 0..4 {
        let key = format!("filler{i}");
        assert!(
            store
                .check_sync(Charge::new(key.as_bytes(), &long, 1))
                .unwrap()
                .allowed
        );
    }
    store
}

/// Checks `key` until it is locked; returns the lock's `retry_after`.
async fn lock_out<S: Store>(limiter: &Limiter<S>, key: &str) -> Duration {
    for _ in 0..10 {
        let d = limiter.check(key).await.unwrap();
        if d.retry_after > Some(WINDOW) {
            return d.retry_after.unwrap();
        }
    }
    panic!("{key} was never locked");
}

/// The report: the lock was announced (600 s) and the client was
/// admitted again 11 s later, its lock key decided on the full store's
/// overflow state. Lock-out state has a room of its own.
#[tokio::test]
async fn a_lock_announced_in_a_full_memory_store_holds_for_its_whole_duration() {
    let clock = ManualClock::new();
    let store = full_store(&clock);
    let limiter = Limiter::new(store.clone(), login_policy()).lockout(penalty());
    assert_eq!(lock_out(&limiter, "mallory").await, LOCK);
    assert!(
        store.is_full() && store.overflowed_checks() > 0,
        "the rule's key overflowed"
    );
    clock.advance(Duration::from_secs(11));
    let d = limiter.check("mallory").await.unwrap();
    assert!(!d.allowed, "11 s later: {d:?}");
    assert_eq!(d.retry_after, Some(LOCK - Duration::from_secs(11)));
    clock.advance(LOCK - Duration::from_secs(12));
    assert!(
        !limiter.check("mallory").await.unwrap().allowed,
        "1 s before its end"
    );
    clock.advance(Duration::from_secs(1));
    assert!(
        limiter.check("mallory").await.unwrap().allowed,
        "at its end"
    );
}

/// The room of lock-out state is bounded too: once full, a new strike is
/// refused with a typed error (the layer's fail mode answers), never
/// decided on shared state.
#[tokio::test]
async fn lockout_state_beyond_its_room_is_a_typed_error() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .max_penalty_keys(2)
        .build();
    let limiter = Limiter::new(store, login_policy()).lockout(penalty());
    // a's lock holds one place (its strikes went with the lock); b's
    // strikes the other; b's lock finds no room.
    lock_out(&limiter, "a").await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(limiter.check("b").await);
    }
    assert!(answers[..3].iter().all(Result::is_ok), "{answers:?}");
    match &answers[3] {
        Err(tower_throttle::StoreError::Full { max_keys: 2 }) => {}
        other => panic!("{other:?}"),
    }
    // The lock already held still holds.
    assert!(!limiter.check("a").await.unwrap().allowed);
}

type Answer = (StatusCode, Option<String>);

async fn call<S>(svc: &mut S, user: &str) -> Answer
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Empty<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    let req = Request::builder().header("x-user", user).body(()).unwrap();
    let r = svc.ready().await.unwrap().call(req).await.unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (r.status(), retry)
}

/// The same through the layer: `Retry-After: 600`, then 589 eleven
/// seconds later.
#[tokio::test]
async fn the_layer_keeps_a_lock_announced_in_a_full_memory_store() {
    let clock = ManualClock::new();
    let mut svc = ThrottleLayer::new(full_store(&clock), login_policy())
        .key(HeaderKey::new(HeaderName::from_static("x-user")))
        .lockout(penalty())
        .layer(tower::service_fn(ok));
    let mut last = (StatusCode::OK, None);
    for _ in 0..4 {
        last = call(&mut svc, "mallory").await;
    }
    assert_eq!(last, (StatusCode::TOO_MANY_REQUESTS, Some("600".into())));
    clock.advance(Duration::from_secs(11));
    let again = call(&mut svc, "mallory").await;
    assert_eq!(again, (StatusCode::TOO_MANY_REQUESTS, Some("589".into())));
}

async fn ok(_: Request<()>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

/// A per-user rule (2 per 10 s) and a global one (3 per 10 s) under one
/// lock-out: alice's denials by the global rule alone lock out neither bob
/// nor carol (nor alice), while her denials by her own rule still lock her
/// out. (Before, the global key collected the strikes and was locked: bob
/// and carol were refused 11 s later with `Retry-After: 589`.)
async fn shared_rule_collects_no_strikes<St: Store>(store: St, clock: &ManualClock) {
    let user = HeaderKey::new(HeaderName::from_static("x-user"));
    let mut svc = ThrottleLayer::new(store, login_policy())
        .name("user")
        .key(user)
        .and(Rule::new("all", Policy::sliding_log(3, WINDOW).unwrap()).key(Global))
        .lockout(penalty())
        .layer(tower::service_fn(ok));
    // Three other clients use up the global rule; alice's own has room.
    for user in ["dave", "erin", "frank"] {
        assert_eq!(call(&mut svc, user).await.0, StatusCode::OK);
    }
    for _ in 0..4 {
        let (status, retry) = call(&mut svc, "alice").await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            retry.as_deref(),
            Some("10"),
            "the global rule's own wait, no lock"
        );
    }
    clock.advance(Duration::from_secs(11));
    for user in ["bob", "carol", "alice"] {
        assert_eq!(
            call(&mut svc, user).await.0,
            StatusCode::OK,
            "{user} after 11 s"
        );
    }
    // alice's own rule denies (the global one has room): strikes, a lock.
    clock.advance(Duration::from_secs(11));
    let answers = [
        call(&mut svc, "alice").await,
        call(&mut svc, "alice").await,
        call(&mut svc, "alice").await,
        call(&mut svc, "alice").await,
    ];
    assert_eq!(answers[1].0, StatusCode::OK);
    assert_eq!(
        answers[2],
        (StatusCode::TOO_MANY_REQUESTS, Some("10".into()))
    );
    assert_eq!(
        answers[3],
        (StatusCode::TOO_MANY_REQUESTS, Some("600".into()))
    );
}

#[tokio::test]
async fn a_shared_rule_locks_no_one_out_on_memory() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    shared_rule_collects_no_strikes(store, &clock).await;
}

#[test]
fn a_shared_rule_locks_no_one_out_on_redis() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = redis_on(&server, &clock).await;
        shared_rule_collects_no_strikes(store, &clock).await;
    });
}

async fn redis_on(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("seams")
        .timeout(Duration::from_secs(2))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(3600))
        .connect(server.url())
        .await
        .unwrap()
}

/// Checks a throwaway key until the primary decides again (the probe
/// interval passes on the manual clock; the reconnect is real, so the
/// wait is bounded by a count, never a race).
async fn until_primary_decides<S: Store>(store: &S, clock: &ManualClock) {
    let probe = Policy::fixed_window(1_000_000, WINDOW).unwrap();
    for _ in 0..200 {
        clock.advance(Duration::from_secs(2));
        let d = store.check(Charge::new(b"probe", &probe, 1)).await.unwrap();
        if d.decided_by == DecidedBy::Primary {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the primary never decided again");
}

/// A lock announced by Redis holds while the fallback decides, and after
/// Redis comes back without it (restarted, no persistence); a lock
/// announced by the fallback during an outage holds after Redis is back.
#[test]
fn a_lock_holds_across_fallback_switches_both_ways() {
    let mut server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let memory = MemoryStore::builder()
            .clock(clock.clone())
            .sweep_interval(None)
            .build();
        let store =
            FallbackStore::new(redis_on(&server, &clock).await, memory).clock(clock.clone());
        let limiter = Limiter::new(store.clone(), login_policy()).lockout(penalty());
        let locked_for = |d: tower_throttle::Decision| {
            assert!(!d.allowed, "{d:?}");
            d.retry_after.unwrap()
        };

        // Locked by Redis, then Redis goes away.
        assert_eq!(lock_out(&limiter, "mallory").await, LOCK);
        server.stop();
        clock.advance(Duration::from_secs(11));
        let d = limiter.check("mallory").await.unwrap();
        assert_eq!(
            locked_for(d),
            LOCK - Duration::from_secs(11),
            "on the fallback"
        );

        // Locked by the fallback during the outage.
        assert!(store.is_on_fallback());
        assert_eq!(lock_out(&limiter, "trudy").await, LOCK);

        // Redis is back, empty.
        server.start_again();
        until_primary_decides(&store, &clock).await;
        for who in ["mallory", "trudy"] {
            let d = limiter.check(who).await.unwrap();
            let left = locked_for(d);
            assert!(
                left < LOCK && left > LOCK / 2,
                "{who} after the switch back: {left:?}"
            );
        }
        // Both lift at their end, on whichever store decides.
        clock.advance(LOCK);
        for who in ["mallory", "trudy"] {
            assert!(
                limiter.check(who).await.unwrap().allowed,
                "{who} after its lock"
            );
        }
    });
}
