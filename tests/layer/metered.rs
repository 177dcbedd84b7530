//! Costs settled after the response ([`tower_throttle::meter`]): an estimate
//! charged at admission, the actual cost (reported by the handler, bytes
//! streamed, a number in the trailers) settled through the receipt. Each
//! handler answers with the `tokens` rule's remaining quota as it saw it at
//! admission (`x-remaining`), so the tests read the store's count through
//! the layer, on a clock that moves only when a test says so.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tokio::sync::Notify;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{Global, RequestHead};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::store::fallback::FallbackStore;
use tower_throttle::store::BoxStore;
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, Rule, Store, ThrottleLayer};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

const MINUTE: Duration = Duration::from_secs(60);

/// The request's estimate: its `x-max` header.
fn estimate(req: &RequestHead<'_>) -> u64 {
    let max = req.headers().get("x-max").and_then(|v| v.to_str().ok());
    max.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Answers with `x-remaining` (the tokens rule's, at admission) and, per
/// the request: `x-used` as a `ReportedCost`, `x-chunks` data frames of 50
/// bytes, `x-trailer` as an `x-usage-tokens` trailer; `x-status` as status.
async fn handler(req: Request<()>) -> Result<Response<Body>, Infallible> {
    let info = req.extensions().get::<RateLimitInfo>().cloned();
    let header = |name: &str| -> Option<u64> {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
    };
    let chunks = header("x-chunks").unwrap_or(0);
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..chunks)
        .map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; 50]))))
        .collect();
    if let Some(tokens) = header("x-trailer") {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-usage-tokens", HeaderValue::from(tokens));
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let mut response = Response::new(StreamBody::new(stream::iter(frames)).boxed());
    if let Some(used) = header("x-used") {
        response.extensions_mut().insert(ReportedCost(used));
    }
    if let Some(status) = header("x-status") {
        *response.status_mut() = StatusCode::from_u16(status as u16).unwrap();
    }
    let remaining = info.and_then(|i| i.get("tokens").map(|d| d.remaining));
    if let Some(remaining) = remaining {
        response
            .headers_mut()
            .insert("x-remaining", HeaderValue::from(remaining));
    }
    Ok(response)
}

fn req(headers: &[(&str, u64)]) -> Request<()> {
    let mut b = Request::builder().uri("/v1/chat");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(()).unwrap()
}

/// Sends a request and reads its body to the end: `(status, x-remaining)`.
async fn send<S>(svc: &mut S, headers: &[(&str, u64)]) -> (StatusCode, Option<u64>)
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Body>>>,
    S::Error: std::fmt::Debug,
{
    let response = svc.ready().await.unwrap().call(req(headers)).await.unwrap();
    let status = response.status();
    let remaining =
        (response.headers().get("x-remaining")).map(|v| v.to_str().unwrap().parse().unwrap());
    response.into_body().collect().await.unwrap();
    (status, remaining)
}

fn tokens(actual: ActualCost) -> Rule {
    Rule::new("tokens", Policy::fixed_window(100, MINUTE).unwrap())
        .cost_fn(estimate)
        .settle_cost(actual)
}

fn layer<St: Store>(store: St, tokens: Rule) -> ThrottleLayer<St> {
    // A generous request limit beside the metered rule: the layer's first.
    ThrottleLayer::new(store, Policy::fixed_window(1_000, MINUTE).unwrap())
        .name("requests")
        .cost(1)
        .key(Global)
        .and(tokens)
        .request_info(true)
        .headers_on_allowed(true)
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(clock.clone()).build()
}

/// An upper-bound estimate, settled down to what the handler reports: the
/// rest goes back, so the quota holds exactly what was used. Run on the
/// memory store, behind `BoxStore`, and through a `FallbackStore`.
#[tokio::test]
async fn a_reported_cost_gives_back_the_rest_of_the_estimate_on_every_store() {
    let clock = ManualClock::new();
    let stores: Vec<(&str, BoxStore)> = vec![
        ("memory", BoxStore::new(memory(&clock))),
        ("boxed", BoxStore::new(BoxStore::new(memory(&clock)))),
        (
            "fallback",
            BoxStore::new(FallbackStore::new(memory(&clock), memory(&clock))),
        ),
    ];
    for (name, store) in stores {
        let mut svc = layer(store, tokens(ActualCost::Reported)).layer(tower::service_fn(handler));
        let first = send(&mut svc, &[("x-max", 50), ("x-used", 10)]).await;
        assert_eq!(first, (StatusCode::OK, Some(50)), "{name}");
        // 10 used, 40 given back: this estimate of 50 leaves 40.
        let second = send(&mut svc, &[("x-max", 50), ("x-used", 0)]).await;
        assert_eq!(second, (StatusCode::OK, Some(40)), "{name}");
        // 90 left: an estimate of 91 is refused, one of 90 fits.
        let over = send(&mut svc, &[("x-max", 91), ("x-used", 0)]).await;
        assert_eq!(over.0, StatusCode::TOO_MANY_REQUESTS, "{name}");
        let fits = send(&mut svc, &[("x-max", 90), ("x-used", 90)]).await;
        assert_eq!(fits, (StatusCode::OK, Some(0)), "{name}");
        let spent = send(&mut svc, &[("x-max", 1)]).await;
        assert_eq!(spent.0, StatusCode::TOO_MANY_REQUESTS, "{name}");
    }
}

/// A cost above the estimate is charged on top, as far as the quota has
/// room: the next request finds the quota spent, not overdrawn further.
#[tokio::test]
async fn a_cost_above_the_estimate_is_charged_as_far_as_the_quota_has_room() {
    let clock = ManualClock::new();
    let mut svc =
        layer(memory(&clock), tokens(ActualCost::Reported)).layer(tower::service_fn(handler));
    let first = send(&mut svc, &[("x-max", 10), ("x-used", 30)]).await;
    assert_eq!(first, (StatusCode::OK, Some(90)));
    // 30 charged in all: an estimate of 10 leaves 60.
    let second = send(&mut svc, &[("x-max", 10), ("x-used", 500)]).await;
    assert_eq!(second, (StatusCode::OK, Some(60)));
    // 500 did not fit in the 70 left: the quota is spent, no more.
    let third = send(&mut svc, &[("x-max", 1)]).await;
    assert_eq!(third.0, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(MINUTE);
    let next_window = send(&mut svc, &[("x-max", 100), ("x-used", 0)]).await;
    assert_eq!(next_window, (StatusCode::OK, Some(0)), "no debt carried");
}

/// Bytes are counted as the body's data frames go out: 3 × 50 against an
/// estimate of 100 charges 50 more; a response the client drops after one
/// frame pays for that frame only. A cost never reported keeps the estimate.
#[tokio::test]
async fn response_bytes_are_counted_as_they_stream() {
    let clock = ManualClock::new();
    let bytes = Rule::new("tokens", Policy::fixed_window(1_000, MINUTE).unwrap())
        .cost_fn(estimate)
        .settle_cost(ActualCost::ResponseBytes);
    let mut svc = layer(memory(&clock), bytes).layer(tower::service_fn(handler));
    let streamed = send(&mut svc, &[("x-max", 100), ("x-chunks", 3)]).await;
    assert_eq!(streamed, (StatusCode::OK, Some(900)));
    // 150 charged: this estimate of 100 leaves 750.
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(req(&[("x-max", 100), ("x-chunks", 4)]))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-remaining"], "750");
    // A quota settled in bytes announces its unit.
    let policy = response.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(
        policy.contains(r#""tokens";q=1000;qu="content-bytes";w=60"#),
        "{policy}"
    );
    let mut body = response.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap().len(), 50);
    drop(body);
    // 150 + 50: 800 left, of which an estimate of 0 is charged 1.
    let after_drop = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(after_drop, (StatusCode::OK, Some(799)));
}

/// A streamed response reporting its usage in a trailer: settled when the
/// trailers go out; without the trailer the head's `ReportedCost` is used,
/// and without either the estimate stands.
#[tokio::test]
async fn a_cost_in_the_trailers_settles_a_streamed_response() {
    let clock = ManualClock::new();
    let name = http::HeaderName::from_static("x-usage-tokens");
    let mut svc =
        layer(memory(&clock), tokens(ActualCost::Trailer(name))).layer(tower::service_fn(handler));
    let first = send(
        &mut svc,
        &[("x-max", 40), ("x-chunks", 2), ("x-trailer", 5)],
    )
    .await;
    assert_eq!(first, (StatusCode::OK, Some(60)));
    let second = send(&mut svc, &[("x-max", 40), ("x-used", 15)]).await;
    assert_eq!(
        second,
        (StatusCode::OK, Some(55)),
        "5 charged by the trailer"
    );
    let third = send(&mut svc, &[("x-max", 20), ("x-chunks", 1)]).await;
    assert_eq!(third, (StatusCode::OK, Some(60)), "15 by the head's report");
    // An estimate of 0 is charged 1: 60 left before it.
    let peek = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(peek, (StatusCode::OK, Some(59)), "the unreported 20 stand");
}

/// With `count_if`, a response that does not count gives back its whole
/// estimate, whatever it reports; one that counts is settled to its cost.
/// The request rule (not settled) keeps its count either way.
#[tokio::test]
async fn count_if_and_a_settled_cost_compose() {
    let clock = ManualClock::new();
    let mut svc = layer(memory(&clock), tokens(ActualCost::Reported))
        .count_if(|s| !s.is_server_error())
        .layer(tower::service_fn(handler));
    let failed = send(
        &mut svc,
        &[("x-max", 50), ("x-used", 30), ("x-status", 503)],
    )
    .await;
    assert_eq!(failed, (StatusCode::SERVICE_UNAVAILABLE, Some(50)));
    let ok = send(&mut svc, &[("x-max", 50), ("x-used", 30)]).await;
    assert_eq!(ok, (StatusCode::OK, Some(50)), "the 503 cost nothing");
    // An estimate of 0 is charged 1: 70 left before it.
    let peek = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(peek, (StatusCode::OK, Some(69)));
}

/// Settled after a window boundary: the refund goes to the window the
/// estimate was taken in (ended, it keeps its count), never into the new
/// one, where another request has been charged meanwhile.
#[tokio::test]
async fn a_settlement_after_a_window_boundary_lands_in_the_estimate_s_window() {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(59));
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (entering, held) = (entered.clone(), release.clone());
    let svc = layer(memory(&clock), tokens(ActualCost::Reported)).layer(tower::service_fn(
        move |req: Request<()>| {
            let (entering, held) = (entering.clone(), held.clone());
            async move {
                if req.headers().contains_key("x-slow") {
                    entering.notify_one();
                    held.notified().await;
                }
                handler(req).await
            }
        },
    ));
    let slow =
        tokio::spawn(
            svc.clone()
                .oneshot(req(&[("x-max", 80), ("x-used", 10), ("x-slow", 1)])),
        );
    // The slow request is admitted (80 of window 0) and waits in its handler.
    entered.notified().await;
    clock.advance(Duration::from_secs(2));
    let mut svc = svc;
    let in_new = send(&mut svc, &[("x-max", 50), ("x-used", 50)]).await;
    assert_eq!(in_new, (StatusCode::OK, Some(50)), "window 1 starts whole");
    release.notify_one();
    let slow = slow.await.unwrap().unwrap();
    assert_eq!(slow.headers()["x-remaining"], "20");
    slow.into_body().collect().await.unwrap();
    // 70 went back to window 0; window 1 still holds its 50 (and this
    // estimate of 0, charged 1).
    let peek = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(peek, (StatusCode::OK, Some(49)));
}

/// GCRA gives units back to the charge's own slot: a token bucket of 100
/// refilled 1/s, an estimate of 60 settled to 20, leaves 80 at once.
#[tokio::test]
async fn a_token_bucket_gets_its_units_back() {
    let clock = ManualClock::new();
    let bucket = Rule::new("tokens", Policy::token_bucket(100, 1.0).unwrap())
        .cost_fn(estimate)
        .settle_cost(ActualCost::Reported);
    let mut svc = layer(memory(&clock), bucket).layer(tower::service_fn(handler));
    let first = send(&mut svc, &[("x-max", 60), ("x-used", 20)]).await;
    assert_eq!(first, (StatusCode::OK, Some(40)));
    // 80 left, of which an estimate of 0 is charged 1.
    let peek = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(peek, (StatusCode::OK, Some(79)));
}

/// Sequential requests with upper-bound estimates never pass the limit:
/// whatever the costs reported (each ≤ its estimate), the sum of costs
/// admitted within a window stays within 100.
#[tokio::test]
async fn sequential_upper_bound_estimates_never_pass_the_limit() {
    let clock = ManualClock::new();
    let mut svc =
        layer(memory(&clock), tokens(ActualCost::Reported)).layer(tower::service_fn(handler));
    let mut used_in_window = 0;
    let mut seed = 7u64;
    for step in 0..400 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let max = (seed >> 33) % 40;
        let used = (seed >> 17) % (max + 1);
        let (status, _) = send(&mut svc, &[("x-max", max), ("x-used", used)]).await;
        if status == StatusCode::OK {
            used_in_window += used;
        }
        assert!(used_in_window <= 100, "step {step}: {used_in_window}");
        if step % 37 == 36 {
            clock.advance(MINUTE);
            used_in_window = 0;
        }
    }
}

/// Concurrent requests with upper-bound estimates never pass the limit
/// either: 30 requests of estimate 10 are in flight at once on a quota of
/// 100 (each admitted one held in its handler), so exactly 10 are
/// admitted; they report 3 each after, and 70 is left.
#[tokio::test]
async fn concurrent_upper_bound_estimates_never_pass_the_limit() {
    let clock = ManualClock::new();
    let release = Arc::new(Notify::new());
    let held = release.clone();
    let svc = layer(memory(&clock), tokens(ActualCost::Reported)).layer(tower::service_fn(
        move |req: Request<()>| {
            let waiting = req
                .headers()
                .contains_key("x-hold")
                .then(|| held.clone().notified_owned());
            async move {
                if let Some(waiting) = waiting {
                    waiting.await;
                }
                handler(req).await
            }
        },
    ));
    // Polled once each: the memory store decides in process, so a refusal
    // is ready at once and an admission waits in its handler.
    let mut in_flight = Vec::new();
    for _ in 0..30 {
        let mut call =
            Box::pin(
                svc.clone()
                    .oneshot(req(&[("x-max", 10), ("x-used", 3), ("x-hold", 1)])),
            );
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(response) => {
                assert_eq!(response.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
            }
            std::task::Poll::Pending => in_flight.push(call),
        }
    }
    assert_eq!(in_flight.len(), 10, "10 estimates of 10 fit in 100");
    release.notify_waiters();
    for call in in_flight {
        let response = call.await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap();
    }
    let mut svc = svc;
    // 70 left, of which an estimate of 0 is charged 1.
    let peek = send(&mut svc, &[("x-max", 0)]).await;
    assert_eq!(peek, (StatusCode::OK, Some(69)));
}

/// Delay mode with a settled cost: a request whose estimate does not fit
/// waits for its slot, runs there, and its unused units go back to the
/// slot they were reserved in, so the next waiter runs that much sooner.
/// A token bucket of 5 refilled 1/s, on paused tokio time.
#[tokio::test(start_paused = true)]
async fn delay_mode_settles_a_waiters_cost_into_its_reserved_slot() {
    let store = crate::tokio_clock::tokio_store();
    let bucket = Rule::new(
        "tokens",
        Policy::cell(4, 5, Duration::from_secs(5)).unwrap(),
    )
    .cost_fn(estimate)
    .settle_cost(ActualCost::Reported);
    let start = tokio::time::Instant::now();
    let svc = layer(store, bucket)
        .delay_up_to(Duration::from_secs(10))
        .layer(tower::service_fn(move |req: Request<()>| async move {
            let ran = start.elapsed();
            let mut response = handler(req).await?;
            let ms = HeaderValue::from(ran.as_millis() as u64);
            response.headers_mut().insert("x-ran-ms", ms);
            Ok::<_, Infallible>(response)
        }));
    let ran_at = |headers: &'static [(&'static str, u64)]| {
        let svc = svc.clone();
        async move {
            let response = svc.oneshot(req(headers)).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "{headers:?}");
            let ms = response.headers()["x-ran-ms"].to_str().unwrap();
            let ms: u64 = ms.parse().unwrap();
            response.into_body().collect().await.unwrap();
            Duration::from_millis(ms)
        }
    };
    // 5 charged, 1 used: 4 left at once.
    assert_eq!(ran_at(&[("x-max", 5), ("x-used", 1)]).await, Duration::ZERO);
    assert_eq!(ran_at(&[("x-max", 4), ("x-used", 4)]).await, Duration::ZERO);
    // Spent: 3 units come back in 3 s; the waiter uses none of them.
    assert_eq!(
        ran_at(&[("x-max", 3), ("x-used", 0)]).await,
        Duration::from_secs(3)
    );
    // Its 3 units went back to its slot: the next 3 run at once.
    assert_eq!(
        ran_at(&[("x-max", 3), ("x-used", 3)]).await,
        Duration::from_secs(3)
    );
    // And an estimate of 0 on the spent bucket waits for a unit, as 1 would.
    assert_eq!(
        ran_at(&[("x-max", 0), ("x-used", 0)]).await,
        Duration::from_secs(4)
    );
}
