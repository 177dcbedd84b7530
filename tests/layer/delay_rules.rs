//! Delay mode with several rules: a request that waits for one rule's slot
//! must not let another rule count it at an earlier instant. If a shared
//! rule charged a waiter at its own (earlier) slot, the request would still
//! run only when its own per-user rule allows, and another request could run
//! in the shared rule's slot at that same instant: more than the shared rule
//! allows.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::{Policy, Rule, ThrottleLayer};

use crate::tokio_clock;
use tokio_clock::tokio_store;

const USER: HeaderName = HeaderName::from_static("x-user");

fn request(user: u32) -> Request<()> {
    Request::builder()
        .header(USER, user.to_string())
        .body(())
        .unwrap()
}

/// Sends `users` in order, all at once, through a layer limiting everyone
/// to one request per second (no burst) and each user to one per 10 s,
/// waiting up to `max_wait`; returns (user, when it ran) for each admitted
/// request, and the number refused.
async fn run(users: &[u32], max_wait: Duration) -> (Vec<(u32, Duration)>, usize) {
    let store = tokio_store();
    let layer = ThrottleLayer::new(store, Policy::cell(0, 1, Duration::from_secs(1)).unwrap())
        .key(Global)
        .and(
            Rule::new("user", Policy::cell(0, 1, Duration::from_secs(10)).unwrap())
                .key(HeaderKey::new(USER)),
        )
        .delay_up_to(max_wait);
    let start = tokio::time::Instant::now();
    let svc = layer.layer(tower::service_fn(move |req: Request<()>| async move {
        let user: u32 = req.headers()[USER].to_str().unwrap().parse().unwrap();
        let at = start.elapsed().as_nanos();
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
            "{user} {at}"
        )))))
    }));
    let tasks: Vec<_> = users
        .iter()
        .map(|&u| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request(u)).await.unwrap() })
        })
        .collect();
    let mut ran = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let response = t.await.unwrap();
        match response.status() {
            StatusCode::OK => {
                use http_body_util::BodyExt;
                let body = response.into_body().collect().await.unwrap().to_bytes();
                ran.push(parse(&body));
            }
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    ran.sort_by_key(|&(_, at)| at);
    (ran, refused)
}

fn parse(body: &[u8]) -> (u32, Duration) {
    let text = std::str::from_utf8(body).unwrap();
    let (user, nanos) = text.split_once(' ').unwrap();
    (
        user.parse().unwrap(),
        Duration::from_nanos(nanos.parse().unwrap()),
    )
}

/// No two admitted requests closer than `gap` (all of them), and than
/// `per_user` for one user.
fn assert_spaced(ran: &[(u32, Duration)], gap: Duration, per_user: Duration) {
    for pair in ran.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= gap,
            "the global rule allows one a second, yet {pair:?} ran: {ran:?}"
        );
    }
    for (i, &(user, at)) in ran.iter().enumerate() {
        for &(other, later) in &ran[i + 1..] {
            if other == user {
                assert!(
                    later - at >= per_user,
                    "user {user} ran at {at:?} and {later:?}: {ran:?}"
                );
            }
        }
    }
}

/// User 1 sends twice, then users 2..=10 once each, all at 0 s. User 1's
/// second request waits for its own rule (10 s) while users 2..=10 take the
/// global rule's slots at 1..9 s. Before, user 1's second request was
/// counted by the global rule in its slot at 1 s and ran at 10 s beside
/// user 10's: two at once where the global rule allows one.
#[tokio::test(start_paused = true)]
async fn a_waiter_is_counted_by_every_rule_when_it_runs() {
    let users = [1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let max_wait = Duration::from_secs(30);
    let (ran, refused) = run(&users, max_wait).await;
    assert_spaced(&ran, Duration::from_secs(1), Duration::from_secs(10));
    assert!(ran.iter().all(|&(_, at)| at <= max_wait), "{ran:?}");
    // Requests counted by two rules do not reserve slots: they check again
    // when their wait is over, and the last of nine racing for the global
    // rule may lose MAX_DELAY_ATTEMPTS times.
    assert!(refused <= 1, "{refused} refused: {ran:?}");
    assert_eq!(ran.len() + refused, users.len());
}

/// Several users each sending several requests at once: never two at one
/// instant in the global rule, never two within 10 s for one user.
#[tokio::test(start_paused = true)]
async fn waiters_of_many_users_never_share_a_slot() {
    let users: Vec<u32> = (0..4).flat_map(|_| 1..=6).collect();
    let (ran, _) = run(&users, Duration::from_secs(60)).await;
    assert_spaced(&ran, Duration::from_secs(1), Duration::from_secs(10));
    assert!(ran.len() >= 12, "most of them fit in 60 s: {ran:?}");
}

/// One counting rule and a concurrency rule: requests still reserve their
/// GCRA slots, so ten waiters go at 0..9 s in turn. Checking again instead,
/// the tenth would lose the race nine times, more than MAX_DELAY_ATTEMPTS,
/// and be refused.
#[tokio::test(start_paused = true)]
async fn one_counting_rule_beside_a_concurrency_rule_still_reserves() {
    let store = tokio_store();
    let layer = ThrottleLayer::new(store, Policy::cell(0, 1, Duration::from_secs(1)).unwrap())
        .key(Global)
        .and(Rule::new("inflight", Policy::concurrency(100).unwrap()).key(Global))
        .delay_up_to(Duration::from_secs(9));
    let start = tokio::time::Instant::now();
    let svc = layer.layer(tower::service_fn(move |_: Request<()>| async move {
        let at = start.elapsed().as_nanos();
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("0 {at}")))))
    }));
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request(0)).await.unwrap() })
        })
        .collect();
    let mut at = Vec::new();
    for t in tasks {
        use http_body_util::BodyExt;
        let response = t.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        at.push(parse(&body).1);
    }
    at.sort();
    assert_eq!(at, (0..10).map(Duration::from_secs).collect::<Vec<_>>());
}
