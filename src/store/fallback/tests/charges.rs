//! Where charges land: permits released, refunds given and resets made on
//! the store that took them, and fallback permit ids forgotten in time.

use super::*;
use crate::store::fallback::permits::MIN_PRUNE_AT;

#[test]
fn permits_are_released_on_the_store_that_granted_them() {
    let (clock, primary, store) = setup();
    let p = Policy::concurrency(1).unwrap();
    let rule = Charge::new(b"c", &p, 1);
    block_on(async {
        let on_primary = store.check(rule).await.unwrap().permit.unwrap();
        primary.set(DOWN);
        let d = store.check(rule).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        let on_fallback = d.permit.unwrap();
        assert!(!store.check(rule).await.unwrap().allowed, "fallback full");
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        assert!(!store.check(rule).await.unwrap().allowed, "primary full");
        let calls = primary.calls();
        store.release(b"c", &p, on_fallback).await.unwrap();
        assert_eq!(primary.calls(), calls, "not sent to the primary");
        assert!(store.fallback().at_once(rule).unwrap().unwrap().allowed);
        store.release(b"c", &p, on_primary).await.unwrap();
        let d = store.check(rule).await.unwrap();
        assert_eq!((d.allowed, d.decided_by), (true, DecidedBy::Primary));
    });
}

/// A reset reaches both stores; while the primary is out it is no error
/// (a lock-out resets strikes on every lock): the fallback alone is reset.
#[test]
fn reset_reaches_both_stores_and_the_fallback_alone_in_an_outage() {
    let (clock, primary, store) = setup();
    let p = window(1);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        store.check(rule).await.unwrap();
        primary.set(DOWN);
        store.check(rule).await.unwrap();
        store.reset(b"k", &p).await.unwrap();
        assert!(store.fallback().at_once(rule).unwrap().unwrap().allowed);
        // The primary kept its count: it was out.
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        assert!(
            !store.check(rule).await.unwrap().allowed,
            "the primary's unit"
        );
        assert_eq!(
            store.check(rule).await.unwrap().decided_by,
            DecidedBy::Primary
        );
        // Both answer: both are reset.
        store.reset(b"k", &p).await.unwrap();
        let peek = Charge::new(b"k", &p, 0);
        assert_eq!(store.primary().check(peek).await.unwrap().remaining, 1);
    });
}

#[test]
fn fallback_permit_ids_are_forgotten_once_their_lease_is_over() {
    let (clock, primary, store) = setup();
    let p = Policy::concurrency_with_lease(1, Duration::from_secs(1)).unwrap();
    primary.set(DOWN);
    block_on(async {
        for i in 0..(MIN_PRUNE_AT as u64 * 3) {
            let key = i.to_be_bytes();
            let d = store.check(Charge::new(&key, &p, 1)).await.unwrap();
            assert!(d.allowed);
            clock.advance(Duration::from_millis(10));
        }
    });
    let held = store.shared.permits.lock().unwrap().map.len();
    assert!(held <= MIN_PRUNE_AT, "{held} permit ids kept");
}

/// A refund goes to the store that took the charge, whichever decides now:
/// units taken on the fallback during an outage go back to the fallback
/// after the primary is back (not to the primary's count), and units taken
/// on the primary go back to the primary.
#[test]
fn refunds_go_to_the_store_that_took_the_charge() {
    let (clock, primary, store) = setup();
    let p = window(2);
    let rule = Charge::new(b"k", &p, 1);
    let peek = Charge::new(b"k", &p, 0);
    block_on(async {
        let on_primary = store.check(rule).await.unwrap();
        assert_eq!(on_primary.decided_by, DecidedBy::Primary);
        primary.set(DOWN);
        let on_fallback = store.check(rule).await.unwrap();
        assert_eq!(on_fallback.decided_by, DecidedBy::Fallback);
        let fallback_receipt = on_fallback.receipt().unwrap();
        assert_eq!(fallback_receipt.store(), DecidedBy::Fallback);

        // Back on the primary: the fallback's unit returns to the fallback.
        primary.set(0);
        clock.advance(DEFAULT_PROBE_INTERVAL);
        store.refund(b"k", &p, &fallback_receipt).await.unwrap();
        assert_eq!(
            store.fallback().at_once(peek).unwrap().unwrap().remaining,
            2
        );
        assert_eq!(
            store.primary().check(peek).await.unwrap().remaining,
            1,
            "untouched"
        );

        // The primary's unit returns to the primary, even while it is out
        // (then the refund fails and the unit stays counted).
        primary.set(DOWN);
        let receipt = on_primary.receipt().unwrap();
        assert!(store
            .refund(b"k", &p, &receipt)
            .await
            .unwrap_err()
            .is_unavailable());
        primary.set(0);
        store.refund(b"k", &p, &receipt).await.unwrap();
        assert_eq!(store.primary().check(peek).await.unwrap().remaining, 2);
    });
}

/// A concurrency permit taken on the fallback is refunded by its own id
/// there (the fallback's ids are renumbered by the pair).
#[test]
fn a_fallback_permit_is_refunded_by_its_own_lease() {
    let (_clock, primary, store) = setup();
    let p = Policy::concurrency_with_lease(2, Duration::from_secs(60)).unwrap();
    let rule = Charge::new(b"c", &p, 1);
    primary.set(DOWN);
    block_on(async {
        let first = store.check(rule).await.unwrap();
        let second = store.check(rule).await.unwrap();
        assert!(first.allowed && second.allowed);
        assert!(!store.check(rule).await.unwrap().allowed, "two in flight");
        store
            .refund(b"c", &p, &first.receipt().unwrap())
            .await
            .unwrap();
        assert!(
            store.check(rule).await.unwrap().allowed,
            "the first's lease is gone"
        );
        // The second still holds its own.
        assert!(!store.check(rule).await.unwrap().allowed);
    });
}
