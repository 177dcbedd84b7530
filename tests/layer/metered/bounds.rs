//! Settlements land in the estimate's window or slot, and estimates never pass the limit.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::meter::ActualCost;
use tower_throttle::{Policy, Rule};

use super::{estimate, handler, layer, memory, req, send, tokens, MINUTE};

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
