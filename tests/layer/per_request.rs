//! Per-request policies, skipping, counting by outcome, and the direct
//! API's waiting and multi-rule limiter.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::FromExtension;
use tower_throttle::resolve::{resolver_fn, CachedResolver};
use tower_throttle::{Limiter, MemoryStore, Policy, RateLimitInfo, Rule, ThrottleLayer};

const MIN: Duration = Duration::from_secs(60);

/// A store on a clock that stands still: a window boundary mid-test would
/// change the counts asserted below (a fixed window reopens; a sliding
/// window's previous count starts to fade).
fn frozen_store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

#[derive(Clone)]
struct User(&'static str);
impl std::fmt::Display for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

#[derive(Clone, Copy)]
enum Tier {
    Free,
    Premium,
}

fn req(user: &'static str, tier: Option<Tier>) -> Request<()> {
    let mut r = Request::new(());
    r.extensions_mut().insert(User(user));
    if let Some(t) = tier {
        r.extensions_mut().insert(t);
    }
    r
}

type Resp = Response<Full<Bytes>>;

/// Answers 200 with the applied policy's limit in the body, from the
/// `RateLimitInfo` extension.
fn echo_limit(
) -> impl tower::Service<Request<()>, Response = Resp, Error = Infallible, Future = impl Send> + Clone
{
    service_fn(|r: Request<()>| async move {
        let limit = r
            .extensions()
            .get::<RateLimitInfo>()
            .and_then(|i| i.policy("reply").map(Policy::limit));
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("{limit:?}")))))
    })
}

fn tiers_layer() -> ThrottleLayer<MemoryStore<ManualClock>> {
    let premium = Policy::sliding_window(50, MIN).unwrap();
    ThrottleLayer::new(frozen_store(), Policy::sliding_window(5, MIN).unwrap())
        .name("reply")
        .key(FromExtension::<User>::new())
        .policy_from_extension(move |t: &Tier| match t {
            Tier::Premium => Some(premium),
            Tier::Free => None,
        })
}

async fn statuses<S>(svc: &S, user: &'static str, tier: Option<Tier>, n: usize) -> Vec<u16>
where
    S: tower::Service<
            Request<()>,
            Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>,
            Error = Infallible,
        > + Clone,
{
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            svc.clone()
                .oneshot(req(user, tier))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    out
}

#[tokio::test]
async fn a_tier_from_an_extension_sets_the_limit_headers_and_info() {
    let svc = tiers_layer()
        .request_info(true)
        .headers_on_allowed(true)
        .layer(echo_limit());
    // Free (or no tier at all): 5 a minute.
    let free = statuses(&svc, "ann", Some(Tier::Free), 6).await;
    assert_eq!(free, [200, 200, 200, 200, 200, 429]);
    assert_eq!(statuses(&svc, "bob", None, 6).await[5], 429);
    // Premium: 50 a minute.
    let premium = statuses(&svc, "cat", Some(Tier::Premium), 51).await;
    assert!(premium[..50].iter().all(|&s| s == 200));
    assert_eq!(premium[50], 429);

    let ok = svc
        .clone()
        .oneshot(req("dan", Some(Tier::Premium)))
        .await
        .unwrap();
    assert_eq!(ok.headers()["ratelimit-policy"], "\"reply\";q=50;w=60");
    let body = http_body_util::BodyExt::collect(ok.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(body, "Some(50)", "RateLimitInfo shows the applied policy");
    let ok = svc
        .clone()
        .oneshot(req("eve", Some(Tier::Free)))
        .await
        .unwrap();
    assert_eq!(ok.headers()["ratelimit-policy"], "\"reply\";q=5;w=60");

    // The 429 shows the policy applied, for each tier.
    let denied = svc
        .clone()
        .oneshot(req("cat", Some(Tier::Premium)))
        .await
        .unwrap();
    assert_eq!(denied.status(), 429);
    assert_eq!(denied.headers()["ratelimit-policy"], "\"reply\";q=50;w=60");
    assert!(denied.headers().contains_key("retry-after"));
    let denied = svc
        .clone()
        .oneshot(req("ann", Some(Tier::Free)))
        .await
        .unwrap();
    assert_eq!(denied.headers()["ratelimit-policy"], "\"reply\";q=5;w=60");
}

#[tokio::test]
async fn an_upgrade_mid_window_keeps_the_count() {
    let svc = tiers_layer().layer(echo_limit());
    assert_eq!(statuses(&svc, "ann", Some(Tier::Free), 6).await[5], 429);
    // Upgraded: 5 of 50 used, so 45 more.
    let after = statuses(&svc, "ann", Some(Tier::Premium), 46).await;
    assert_eq!(after.iter().filter(|&&s| s == 200).count(), 45);
    assert_eq!(after[45], 429);
}

#[tokio::test]
async fn a_cached_resolver_asks_the_database_once_per_key() {
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    let quotas = CachedResolver::new(
        resolver_fn(move |key: Vec<u8>| {
            c.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::task::yield_now().await; // a real database answers later
                Ok(match &key[..] {
                    b"acme" => Some(Policy::fixed_window(3, MIN)?),
                    b"broken" => return Err("no such table".into()),
                    _ => None,
                })
            }
        }),
        100,
        MIN,
    );
    let layer = ThrottleLayer::new(frozen_store(), Policy::fixed_window(1, MIN).unwrap())
        .and(Rule::new("quota", Policy::fixed_window(2, MIN).unwrap()).resolver(quotas.clone()))
        .name("burst")
        .key(FromExtension::<User>::new());
    let burst = Policy::fixed_window(100, MIN).unwrap();
    let layer = layer.policy_fn(move |_| Some(burst)); // the burst rule is not the point here
    let svc = layer.layer(echo_limit());
    assert_eq!(statuses(&svc, "acme", None, 4).await, [200, 200, 200, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "then from the cache");
    let denied = svc.clone().oneshot(req("acme", None)).await.unwrap();
    assert_eq!(
        denied.headers()["ratelimit-policy"],
        "\"burst\";q=100;w=60, \"quota\";q=3;w=60"
    );
    // Unknown and failing customers get the rule's own quota of 2.
    assert_eq!(statuses(&svc, "zed", None, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&svc, "broken", None, 3).await, [200, 200, 429]);
    assert!(quotas.len() >= 2);
}

#[tokio::test]
async fn skipped_requests_bypass_the_layer() {
    let layer = ThrottleLayer::new(frozen_store(), Policy::fixed_window(1, MIN).unwrap())
        .key(FromExtension::<User>::new())
        .skip_if(|r| r.uri().path() == "/healthz");
    let svc = layer.layer(echo_limit());
    for _ in 0..3 {
        let mut r = req("ann", None);
        *r.uri_mut() = "/healthz".parse().unwrap();
        assert_eq!(svc.clone().oneshot(r).await.unwrap().status(), 200);
    }
    // Not even a key is needed.
    let mut r = Request::new(());
    *r.uri_mut() = "/healthz".parse().unwrap();
    assert_eq!(svc.clone().oneshot(r).await.unwrap().status(), 200);
    assert_eq!(
        statuses(&svc, "ann", None, 2).await,
        [200, 429],
        "others are counted"
    );
}

/// A login handler: the password "right" succeeds, anything else is 401.
fn login(
) -> impl tower::Service<Request<()>, Response = Resp, Error = Infallible, Future = impl Send> + Clone
{
    service_fn(|r: Request<()>| async move {
        let status = if r.uri().path() == "/right" {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = status;
        Ok::<_, Infallible>(resp)
    })
}

fn attempt(password: &str) -> Request<()> {
    let mut r = req("ann", None);
    *r.uri_mut() = format!("/{password}").parse().unwrap();
    r
}

#[tokio::test]
async fn only_failed_logins_count_and_the_sixth_in_a_row_is_refused() {
    // 5 failed logins per 15 minutes.
    let layer = ThrottleLayer::new(
        MemoryStore::new(),
        Policy::sliding_log(5, Duration::from_secs(900)).unwrap(),
    )
    .key(FromExtension::<User>::new())
    .count_if(|s| s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN);
    let svc = layer.layer(login());
    let mut seen = Vec::new();
    for password in [
        "right", "a", "right", "b", "c", "right", "d", "e", "f", "right",
    ] {
        seen.push(
            svc.clone()
                .oneshot(attempt(password))
                .await
                .unwrap()
                .status()
                .as_u16(),
        );
    }
    // Successes never count: the 5 failures pass, the 6th attempt after them
    // (a failure) is refused, and so is any attempt until the window passes.
    assert_eq!(seen, [200, 401, 200, 401, 401, 200, 401, 401, 429, 429]);
}

#[tokio::test]
async fn server_errors_are_refunded() {
    let layer = ThrottleLayer::new(frozen_store(), Policy::fixed_window(2, MIN).unwrap())
        .key(FromExtension::<User>::new())
        .count_if(|s| !s.is_server_error());
    let failing = service_fn(|_: Request<()>| async {
        let mut r = Response::new(Full::new(Bytes::new()));
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        Ok::<_, Infallible>(r)
    });
    let svc = layer.layer(failing);
    assert_eq!(statuses(&svc, "ann", None, 10).await, [502; 10]);
    let ok = layer.layer(login());
    assert_eq!(
        statuses(&ok, "ann", None, 3).await,
        [401, 401, 429],
        "the 502s left the quota whole"
    );
}

use crate::tokio_clock;
use tokio_clock::tokio_store;

#[tokio::test(start_paused = true)]
async fn wait_reserves_gcra_slots_in_order_within_the_budget() {
    // One a second, no burst.
    let limiter = Limiter::new(
        tokio_store(),
        Policy::cell(0, 1, Duration::from_secs(1)).unwrap(),
    );
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let d = l.wait("k", Duration::from_millis(3500)).await.unwrap();
                (d.allowed, start.elapsed())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut denied = 0;
    for t in tasks {
        match t.await.unwrap() {
            (true, at) => admitted.push(at),
            (false, at) => {
                assert_eq!(at, Duration::ZERO, "a hopeless wait returns at once");
                denied += 1;
            }
        }
    }
    admitted.sort();
    assert_eq!(admitted, [0, 1, 2, 3].map(Duration::from_secs));
    assert_eq!(denied, 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_its_slot_back() {
    let limiter = Limiter::new(
        tokio_store(),
        Policy::cell(0, 1, Duration::from_secs(1)).unwrap(),
    );
    assert!(limiter.check("k").await.unwrap().allowed);
    let waiter = {
        let l = limiter.clone();
        tokio::spawn(async move { l.wait("k", Duration::from_secs(10)).await })
    };
    tokio::task::yield_now().await;
    waiter.abort();
    let _ = waiter.await;
    tokio::time::advance(Duration::from_secs(1)).await;
    // The slot at 1 s was given back: a check at 1 s is admitted at once.
    assert!(limiter.check("k").await.unwrap().allowed);
}

#[tokio::test(start_paused = true)]
async fn wait_rechecks_other_algorithms_within_the_budget() {
    let limiter = Limiter::new(
        tokio_store(),
        Policy::sliding_log(1, Duration::from_secs(2)).unwrap(),
    );
    let start = tokio::time::Instant::now();
    assert!(limiter.wait("k", Duration::ZERO).await.unwrap().allowed);
    assert!(
        !limiter
            .wait("k", Duration::from_secs(1))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "2 s does not fit in 1 s");
    assert!(
        limiter
            .wait("k", Duration::from_secs(3))
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

#[tokio::test]
async fn a_multi_limiter_is_all_or_nothing() {
    // A manual clock: a window boundary inside the test would refill.
    let store = frozen_store();
    let limiter = Limiter::new(store, Policy::fixed_window(2, MIN).unwrap())
        .named("minute")
        .and(
            "day",
            Policy::fixed_window(3, Duration::from_secs(86_400)).unwrap(),
        )
        .with_prefix("reply");
    assert!(limiter.check("ann").await.unwrap().allowed());
    assert!(limiter.check("ann").await.unwrap().allowed());
    let third = limiter.check("ann").await.unwrap();
    assert!(!third.allowed());
    assert!(third.get("minute").is_some_and(|d| !d.allowed));
    // Nothing was taken from the day by the denied check.
    assert_eq!(third.get("day").unwrap().remaining, 1);
    assert_eq!(
        limiter
            .peek("ann")
            .await
            .unwrap()
            .get("day")
            .unwrap()
            .remaining,
        1
    );
    assert!(third.retry_after().is_some());
    // The keys are `prefix:name:key`.
    let day = Limiter::new(
        limiter.store().clone(),
        Policy::fixed_window(3, Duration::from_secs(86_400)).unwrap(),
    );
    assert_eq!(day.peek("reply:day:ann").await.unwrap().remaining, 1);
}
