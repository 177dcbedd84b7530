//! How a cost is settled: reported, above the estimate, streamed bytes, trailers, with `count_if`.

use http::StatusCode;
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::meter::ActualCost;
use tower_throttle::store::fallback::FallbackStore;
use tower_throttle::store::BoxStore;
use tower_throttle::{Policy, Rule};

use super::{estimate, handler, layer, memory, req, send, tokens, MINUTE};

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
