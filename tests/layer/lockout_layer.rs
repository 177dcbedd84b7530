//! `ThrottleLayer::lockout`: after 3 denials within 10 minutes a key is
//! locked for 5, answered 429 with `Retry-After` = the time left, uncharged,
//! on the memory store (in-process path, manual clock) and on Redis (the
//! asynchronous path).

use crate::redis_support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use redis_support::{current_thread_runtime, RedisServer};
use tower::{service_fn, Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::HeaderKey;
use tower_throttle::lockout::Penalty;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Store;
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

const MIN: Duration = Duration::from_secs(60);

/// One answer, as the client sees it.
#[derive(Debug, PartialEq)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    ratelimit: Option<String>,
}

type Svc = tower::util::BoxCloneService<
    Request<()>,
    Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>,
    Infallible,
>;

/// A login route: 2 attempts a minute per user, and the inner service's
/// calls counted.
fn login<St: Store + 'static>(
    store: St,
    layer: impl FnOnce(ThrottleLayer<St>) -> ThrottleLayer<St>,
) -> (Svc, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let inner = service_fn(move |_: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    });
    let base = ThrottleLayer::new(store, Policy::sliding_log(2, MIN).unwrap())
        .name("login")
        .key(HeaderKey::new(HeaderName::from_static("x-user")))
        .lockout(Penalty::new(3, 10 * MIN, 5 * MIN).unwrap());
    (
        tower::util::BoxCloneService::new(layer(base).layer(inner)),
        calls,
    )
}

async fn call(svc: &Svc, user: &str) -> Answer {
    call_as(svc, user, None).await.0
}

async fn call_as(
    svc: &Svc,
    user: &str,
    content_type: Option<&str>,
) -> (
    Answer,
    Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>,
) {
    let mut req = Request::builder().header("x-user", user);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let r = svc.clone().oneshot(req.body(()).unwrap()).await.unwrap();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let answer = Answer {
        status: r.status(),
        retry_after: header("retry-after"),
        ratelimit: header("ratelimit"),
    };
    (answer, r)
}

fn limited(retry_after: u64) -> Answer {
    Answer {
        status: StatusCode::TOO_MANY_REQUESTS,
        retry_after: Some(retry_after.to_string()),
        ratelimit: Some(format!("\"login\";r=0;t={retry_after}")),
    }
}

fn ok(status: &Answer) -> bool {
    status.status == StatusCode::OK
}

/// The scenario on any store whose time `advance` moves.
async fn locks_counts_down_and_lifts(svc: &Svc, calls: &AtomicUsize, advance: impl Fn(Duration)) {
    assert!(ok(&call(svc, "ann").await));
    assert!(ok(&call(svc, "ann").await));
    // Strikes 1 and 2: the rule's own denial.
    assert_eq!(call(svc, "ann").await, limited(60));
    advance(Duration::from_secs(10));
    assert_eq!(call(svc, "ann").await, limited(50));
    // Strike 3 locks: the lock's time, not the rule's 50 s.
    assert_eq!(call(svc, "ann").await, limited(300));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Locked, counting down, though the rule's minute has passed.
    advance(2 * MIN);
    assert_eq!(call(svc, "ann").await, limited(180));
    advance(MIN);
    assert_eq!(call(svc, "ann").await, limited(120));
    // Other keys are not affected.
    assert!(ok(&call(svc, "bob").await));
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    advance(2 * MIN);
    // The lock is over; nothing was charged meanwhile: the full quota.
    assert!(ok(&call(svc, "ann").await));
    assert!(ok(&call(svc, "ann").await));
    // And the key starts over with no strikes: the rule's denial again.
    assert_eq!(call(svc, "ann").await, limited(60));
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn memory_store_locks_a_key_after_three_denials_and_lifts_it_after_five_minutes() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (svc, calls) = login(store, |l| l);
    locks_counts_down_and_lifts(&svc, &calls, |by| clock.advance(by)).await;
}

#[tokio::test]
async fn delay_mode_refuses_a_locked_key_at_once_through_the_asynchronous_path() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    // Waits of up to a second: the rule's denials here are longer, so they
    // are rejected (and count as strikes); a lock is refused, not waited for.
    let (svc, calls) = login(store, |l| l.delay_up_to(Duration::from_secs(1)));
    locks_counts_down_and_lifts(&svc, &calls, |by| clock.advance(by)).await;
}

#[tokio::test]
async fn locked_keys_are_not_charged_on_any_rule() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    // A second rule, an hour's budget of 6: requests refused while locked
    // would use it up if they were charged.
    let (svc, calls) = login(store, |l| {
        l.and(Rule::new(
            "hour",
            Policy::fixed_window(6, 60 * MIN).unwrap(),
        ))
    });
    for _ in 0..2 {
        assert!(ok(&call(&svc, "ann").await));
    }
    for _ in 0..3 {
        assert_eq!(
            call(&svc, "ann").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    for _ in 0..20 {
        assert_eq!(call(&svc, "ann").await.retry_after.as_deref(), Some("300"));
    }
    clock.advance(5 * MIN);
    // 4 of the hour's 6 left: the 20 locked requests took none.
    for _ in 0..2 {
        assert!(ok(&call(&svc, "ann").await));
    }
    clock.advance(MIN);
    for _ in 0..2 {
        assert!(ok(&call(&svc, "ann").await));
    }
    clock.advance(MIN);
    assert_eq!(
        call(&svc, "ann").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn a_dry_run_neither_records_nor_enforces_lockouts() {
    let store = MemoryStore::builder()
        .clock(ManualClock::starting_at(1_700_000_000_000_000_000))
        .build();
    let (svc, calls) = login(store, |l| l.dry_run());
    for _ in 0..10 {
        assert!(ok(&call(&svc, "ann").await));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn grpc_clients_get_resource_exhausted_with_the_lock_time() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let (svc, _) = login(store, |l| l);
    for _ in 0..5 {
        call(&svc, "ann").await;
    }
    clock.advance(MIN);
    let (answer, r) = call_as(&svc, "ann", Some("application/grpc")).await;
    assert_eq!(r.headers()["grpc-status"], "8", "RESOURCE_EXHAUSTED");
    assert!(r.headers().contains_key("grpc-status-details-bin"));
    assert_eq!(
        answer,
        Answer {
            status: StatusCode::OK, // gRPC statuses travel in a 200
            ..limited(240)
        }
    );
}

#[test]
fn redis_locks_a_key_after_three_denials_and_lifts_it_after_five_minutes() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = RedisStore::builder()
            .prefix("lockout-layer")
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap();
        let (svc, calls) = login(store, |l| l);
        locks_counts_down_and_lifts(&svc, &calls, |by| clock.advance(by)).await;
    });
}
