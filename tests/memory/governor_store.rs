//! The governor-backed store agrees with the memory store on GCRA, within its
//! documented differences (no peek/refund/reset; reset_after bounded above).
#![cfg(feature = "governor")]

use std::time::Duration;

use governor::clock::FakeRelativeClock;
use proptest::prelude::*;
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::store::GovernorStore;
use tower_throttle::{MemoryStore, Policy, Store, StoreError};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn agrees_with_memory_store(
        burst in 0..6u64,
        count in 1..6u64,
        period_ms in 1..5_000u64,
        steps in proptest::collection::vec((0..3_000_000_000u64, 1..8u64), 1..40),
    ) {
        let policy = Policy::cell(burst, count, Duration::from_millis(period_ms)).unwrap();
        let manual = ManualClock::new();
        let fake = FakeRelativeClock::default();
        let memory = MemoryStore::builder().clock(manual.clone()).sweep_interval(None).build();
        let gov = GovernorStore::with_clock(fake.clone());
        for (advance, cost) in steps {
            let advance = Duration::from_nanos(advance % (period_ms * 1_000_000));
            manual.advance(advance);
            fake.advance(advance);
            let want = memory.check_sync(Charge::new(b"k", &policy, cost)).unwrap();
            let got = gov.check_sync(Charge::new(b"k", &policy, cost)).unwrap();
            prop_assert_eq!(got.allowed, want.allowed);
            prop_assert_eq!(got.retry_after, want.retry_after);
            prop_assert_eq!(got.limit, want.limit);
            if want.is_never() {
                prop_assert!(got.is_never());
                continue;
            }
            prop_assert_eq!(got.remaining, want.remaining);
            if got.allowed {
                prop_assert!(got.reset_after >= want.reset_after);
            } else {
                prop_assert_eq!(got.reset_after, want.reset_after);
            }
        }
    }
}

#[tokio::test]
async fn unsupported_operations_are_typed_errors() {
    let gov = GovernorStore::new();
    let gcra = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
    let log = Policy::sliding_log(1, Duration::from_secs(1)).unwrap();
    fn unsupported<T>(r: Result<T, StoreError>) -> bool {
        matches!(r, Err(StoreError::Unsupported(_)))
    }
    assert!(unsupported(gov.check(Charge::new(b"k", &log, 1)).await));
    assert!(unsupported(gov.check(Charge::new(b"k", &gcra, 0)).await));
    let admitted = gov.check(Charge::new(b"r", &gcra, 1)).await.unwrap();
    let receipt = admitted.receipt().unwrap_or(Receipt::new(1, 0, None));
    assert!(unsupported(gov.refund(b"r", &gcra, &receipt).await));
    assert!(unsupported(gov.reset(b"k", &gcra).await));
    let d = gov.check(Charge::new(b"k", &gcra, u64::MAX)).await.unwrap();
    assert!(d.is_never());
}

/// governor's time following tokio's (paused) clock.
#[derive(Clone)]
struct TokioGovClock(tokio::time::Instant);

impl governor::clock::Clock for TokioGovClock {
    type Instant = governor::nanos::Nanos;

    fn now(&self) -> Self::Instant {
        governor::nanos::Nanos::from(self.0.elapsed())
    }
}

/// governor's quotas are fixed when built, so it cannot take a reservation's
/// widened tolerance: waiters check again after each denial instead. Before,
/// the store decided the real quota while the caller read the answer as a
/// reservation, so no waiter was ever admitted and each was refused with a
/// retry stretched by its whole budget.
#[tokio::test(start_paused = true)]
async fn waiting_on_governor_checks_again() {
    use tower::{Layer, ServiceExt};
    use tower_throttle::key::Global;
    use tower_throttle::{Limiter, ThrottleLayer};

    let second = Policy::cell(0, 1, Duration::from_secs(1)).unwrap();
    let start = tokio::time::Instant::now();
    let store = GovernorStore::with_clock(TokioGovClock(start));
    assert!(!store.reserves_slots());
    let limiter = Limiter::new(store, second);
    for expected in 0..3 {
        let d = limiter.wait("k", Duration::from_secs(5)).await.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!(start.elapsed(), Duration::from_secs(expected));
    }

    let start = tokio::time::Instant::now();
    let svc = ThrottleLayer::new(GovernorStore::with_clock(TokioGovClock(start)), second)
        .key(Global)
        .delay_up_to(Duration::from_secs(5))
        .layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new()))
        }));
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let status = svc.oneshot(http::Request::new(())).await.unwrap().status();
                (status, start.elapsed())
            })
        })
        .collect();
    let mut admitted = Vec::new();
    for t in tasks {
        let (status, at) = t.await.unwrap();
        assert_eq!(status, http::StatusCode::OK);
        admitted.push(at);
    }
    admitted.sort();
    assert_eq!(admitted, [0, 1, 2].map(Duration::from_secs));
}

/// Two layers on one `GovernorStore` with the same key namespace are refused
/// when the second is built, as on every other store, instead of silently
/// sharing counters.
#[test]
fn two_layers_on_one_governor_store_do_not_share_counters_by_accident() {
    use tower::Layer;
    use tower_throttle::ThrottleLayer;

    let svc = || {
        tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<
                bytes::Bytes,
            >::new()))
        })
    };
    let store = GovernorStore::new();
    let policy = Policy::cell(4, 5, Duration::from_secs(60)).unwrap();
    let _posts = ThrottleLayer::new(store.clone(), policy).layer(svc());
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(ThrottleLayer::new(store.clone(), policy).layer(svc()));
    }));
    let message = *refused.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains(".share_counters()"), "{message}");
    let _replies = ThrottleLayer::new(store, policy)
        .prefix("reply")
        .layer(svc());
}
