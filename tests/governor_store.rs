//! The governor-backed store agrees with the memory store on GCRA, within its
//! documented differences (no peek/refund/reset; reset_after bounded above).
#![cfg(feature = "governor")]

use std::time::Duration;

use governor::clock::FakeRelativeClock;
use proptest::prelude::*;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::GovernorStore;
use tower_throttle::{Charge, MemoryStore, Policy, Store, StoreError};

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
    assert!(unsupported(gov.refund(b"k", &gcra, 1).await));
    assert!(unsupported(gov.reset(b"k", &gcra).await));
    let d = gov.check(Charge::new(b"k", &gcra, u64::MAX)).await.unwrap();
    assert!(d.is_never());
}
