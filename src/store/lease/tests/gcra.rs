//! GCRA leases: units spent up to their virtual slots, refunds into their
//! own slot, and why nothing goes back to the shared store.

use super::{gcra_policy, rig, S};
use crate::algorithm::gcra;
use crate::clock::Clock;
use crate::decision::Receipt;
use crate::policy::Algorithm;
use crate::store::{Charge, Store};

#[tokio::test]
async fn gcra_units_expire_at_their_slots() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    let d = r.check("g", &p).await;
    assert!(d.allowed);
    // Slots t0, t0+1 s, t0+2 s, t0+3 s; unit 0 served at t0.
    assert_eq!(r.store.local_units(b"g"), 3);
    r.advance(S);
    assert_eq!(
        r.store.local_units(b"g"),
        3,
        "unit 1 up to its slot, inclusive"
    );
    r.advance(1);
    assert_eq!(r.store.local_units(b"g"), 2, "unit 1's slot passed");
    r.advance(S / 2 - 1);
    let served = r.check("g", &p).await;
    assert_eq!(r.calls(), 1);
    let t0 = d.charged_at_ns;
    assert_eq!(
        served.charged_at_ns,
        t0 + 2 * S,
        "the receipt names unit 2's slot"
    );
    r.advance(2 * S);
    assert_eq!(r.store.local_units(b"g"), 0, "unit 3's slot passed");
    assert_eq!(r.store.block_target(b"g"), Some(4));
    r.check("g", &p).await;
    assert_eq!(r.calls(), 2);
    assert_eq!(
        r.store.block_target(b"g"),
        Some(2),
        "waste halves the block"
    );
}

#[tokio::test]
async fn a_gcra_refund_goes_back_to_its_own_slot_only() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    r.check("g", &p).await;
    let d1 = r.check("g", &p).await; // unit 1, slot t0 + 1 s
    assert_eq!(r.store.local_units(b"g"), 2);
    r.store
        .refund(b"g", &p, &d1.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"g"), 3);
    // Spent again, and refunded once its slot has passed: nothing comes
    // back, locally or in the shared store.
    let d1 = r.check("g", &p).await;
    assert_eq!(
        d1.charged_at_ns,
        r.clock.now_ns() + S,
        "the same slot again"
    );
    r.advance(S + 1);
    let before = r.shared_remaining("g", &p).await;
    r.store
        .refund(b"g", &p, &d1.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"g"), 2, "units 2 and 3 only");
    assert_eq!(r.shared_remaining("g", &p).await, before);
}

#[tokio::test]
async fn gcra_blocks_start_at_the_queue_when_it_runs_ahead() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    // Someone else took 5 units: TAT = t0 + 5 s.
    r.shared.check(Charge::new(b"g", &p, 5)).await.unwrap();
    r.check("g", &p).await; // slots t0+5 .. t0+8
    r.advance(7 * S);
    assert_eq!(
        r.store.local_units(b"g"),
        2,
        "units 2 and 3: slots t0+7, t0+8"
    );
    let Algorithm::Gcra(g) = *p.algorithm() else {
        unreachable!()
    };
    // Replayed as a sequence, the spends conform.
    let t0 = r.clock.now_ns() - 7 * S;
    let mut tat = gcra::admit(&g, 0, t0, 5);
    for u in [t0, t0 + 7 * S, t0 + 7 * S, t0 + 8 * S] {
        assert!(gcra::check(&g, tat, u, 1).allowed);
        tat = gcra::admit(&g, tat, u, 1);
    }
}

/// Why GCRA leases give nothing back (module docs): a refund frees the
/// tail of the queue, another process's lease. Replayed with the pure
/// functions, the schedule of the docs admits 6 units in [2 s, 3 s] where
/// GCRA allows 5.
#[test]
fn a_gcra_refund_would_free_another_lease_s_slots() {
    let Algorithm::Gcra(g) = *gcra_policy().algorithm() else {
        unreachable!()
    };
    let g = crate::algorithm::GcraParams {
        tolerance_ns: 4 * S,
        limit: 4,
        cell: None,
        ..g
    };
    let t0 = 100 * S;
    let mut tat = gcra::admit(&g, 0, t0, 2); // A, ordinary
    tat = gcra::admit(&g, tat, t0, 2); // B leases slots t0+2, t0+3
    tat = gcra::refund(&g, tat, t0, &Receipt::new(2, t0, None)); // A refunded
    assert!(gcra::check(&g, tat, t0, 2).allowed);
    tat = gcra::admit(&g, tat, t0, 2); // C leases slots t0+2, t0+3
    assert!(gcra::check(&g, tat, t0 + 2 * S, 2).allowed);
    // D's 2 at t0+2, B's and C's at t0+2 and t0+3: replayed, one fails.
    let spends = [2, 2, 2, 2, 3, 3].map(|s| t0 + s * S);
    let mut replay = 0;
    let passed = spends
        .iter()
        .take_while(|&&u| {
            let ok = gcra::check(&g, replay, u, 1).allowed;
            replay = gcra::admit(&g, replay, u, 1);
            ok
        })
        .count();
    assert_eq!(passed, 5);
}

/// A refund of a unit of a GCRA lease that has been replaced is absorbed,
/// never sent to the shared store (whose tail may be another lease).
#[tokio::test]
async fn a_refund_of_a_replaced_gcra_lease_stays_in_process() {
    let r = rig(1, 4, 4);
    let p = gcra_policy();
    let mut served = Vec::new();
    for _ in 0..4 {
        served.push(r.check("g", &p).await);
    }
    assert_eq!(r.calls(), 1, "4 units at once, all within their slots");
    r.check("g", &p).await; // a new block
    assert_eq!(r.calls(), 2);
    let before = r.shared_remaining("g", &p).await;
    let held = r.store.local_units(b"g");
    r.store
        .refund(b"g", &p, &served[2].receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.shared_remaining("g", &p).await, before);
    assert_eq!(r.store.local_units(b"g"), held);
}

/// Reservations (a stretched tolerance) go to the shared store as they are.
#[tokio::test]
async fn gcra_reservations_are_never_leased() {
    let r = rig(1, 4, 4);
    let p = gcra_policy()
        .reserving(std::time::Duration::from_secs(5))
        .unwrap();
    for _ in 0..3 {
        assert!(r.check("g", &p).await.allowed);
    }
    assert_eq!(r.calls(), 3);
    assert_eq!(r.store.local_units(b"g"), 0);
}
