//! Window leases: spent within their window, given back into it, grown
//! and shrunk with use.

use std::time::Duration;

use super::*;
#[tokio::test]
async fn a_window_lease_is_spent_within_its_window_in_one_call() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    let first = r.check("hot", &p).await;
    assert_eq!(r.calls(), 1);
    assert_eq!((first.charged, first.remaining), (1, 99));
    assert_eq!(r.shared_remaining("hot", &p).await, 92, "8 charged at once");
    for left in (0..7).rev() {
        r.advance(S / 100);
        let d = r.check("hot", &p).await;
        assert!(d.allowed && d.charged == 1);
        assert_eq!(d.remaining, 92 + left, "estimate: shared + held");
        assert_eq!(r.store.local_units(b"hot"), left);
    }
    assert_eq!(r.calls(), 1, "no store call while the lease lasts");
    r.check("hot", &p).await;
    assert_eq!(r.calls(), 2, "a spent lease is replaced by a new block");
}

#[tokio::test]
async fn a_window_lease_expires_when_its_window_ends() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.advance(S / 2);
    r.check("hot", &p).await;
    r.advance(S / 2 - 1);
    assert_eq!(r.store.local_units(b"hot"), 7, "last instant of the window");
    r.advance(1);
    assert_eq!(
        r.store.local_units(b"hot"),
        0,
        "expired at the window's end"
    );
    r.check("hot", &p).await;
    assert_eq!(r.calls(), 2);
    assert_eq!(r.store.block_target(b"hot"), Some(4), "halved after waste");
    // One check in the last window: too slow for a block of more than one.
    assert_eq!(r.shared_remaining("hot", &p).await, 99);
}

/// Takes a lease of `p` (fixed window of 1 s) on key `hot` half a window
/// before the key's stored window, written by a clock ahead of this one.
async fn lease_behind(r: &Rig, p: &Policy) {
    let start = r.clock.now_ns();
    r.clock.set_ns(start + S);
    let ahead = Charge::new(b"hot", p, 1);
    assert!(r.shared.check(ahead).await.unwrap().allowed);
    r.clock.set_ns(start + S / 2);
    let first = r.check("hot", p).await;
    assert!(first.allowed);
    assert_eq!(first.charged_at_ns, start + S, "the window it counted in");
    assert_eq!(first.reset_after, Duration::from_nanos(3 * S / 2));
    assert_eq!(r.store.local_units(b"hot"), 7);
}

/// A block charged while the shared key holds a later window (another
/// instance's clock ahead) counts in that window, and its receipt names it:
/// the lease never outlives that window, lasts at most one window from its
/// taking (a clock far behind never spends a window's units after the
/// store moved on), and gives its unspent units back there, as
/// `tests/redis/redis_lease.rs` asserts of four real instances.
#[tokio::test]
async fn a_block_counted_in_a_later_window_is_spent_and_given_back_there() {
    let p = fixed(100);
    // The window it counts in ends 1.5 s after the lease was taken; the
    // lease, one window after.
    let r = rig(1, 8, 8);
    lease_behind(&r, &p).await;
    r.advance(S - 1);
    assert_eq!(r.store.local_units(b"hot"), 7, "for one window");
    r.advance(1);
    assert_eq!(r.store.local_units(b"hot"), 0, "no longer");
    let calls = r.calls();
    r.check("hot", &p).await;
    assert_eq!(r.calls(), calls + 1, "not served from the lease");
    // Unspent units go back into that window (a receipt naming the
    // instant's window would be ignored there: 100 - 1 - 8).
    let r = rig(1, 8, 8);
    lease_behind(&r, &p).await;
    r.advance(S - 1);
    assert_eq!(r.shared_remaining("hot", &p).await, 91);
    r.store.flush().await.unwrap();
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 1 - 1);
}

#[tokio::test]
async fn a_sliding_window_lease_ends_with_its_charged_window() {
    let r = rig(1, 4, 4);
    let p = Policy::sliding_window(100, Duration::from_secs(1)).unwrap();
    r.check("hot", &p).await;
    r.advance(S - 1);
    assert_eq!(r.store.local_units(b"hot"), 3);
    r.advance(1);
    assert_eq!(r.store.local_units(b"hot"), 0);
    // The next check gives the 3 back into the previous count, where they
    // still weigh: the estimate drops from 4 to 1, plus the check (one a
    // window is too slow a rate for a block).
    r.check("hot", &p).await;
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 1 - 1);
}

/// The last clone dropped inside a Tokio runtime gives the unspent units
/// back, on a task of that runtime.
#[tokio::test]
async fn dropping_the_store_gives_unspent_units_back() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    for _ in 0..3 {
        r.check("hot", &p).await;
    }
    assert_eq!(r.shared_remaining("hot", &p).await, 92);
    let Rig { store, shared, .. } = r;
    let clone = store.clone();
    drop(store);
    tokio::task::yield_now().await;
    assert_eq!(
        shared
            .check(Charge::new(b"hot", &p, 0))
            .await
            .unwrap()
            .remaining,
        92,
        "a clone still holds the lease"
    );
    drop(clone);
    // The give-back runs on a task of this runtime: bounded yields, no sleep.
    let mut remaining = 92;
    for _ in 0..100 {
        tokio::task::yield_now().await;
        remaining = shared
            .check(Charge::new(b"hot", &p, 0))
            .await
            .unwrap()
            .remaining;
        if remaining == 97 {
            break;
        }
    }
    assert_eq!(remaining, 97);
}

#[tokio::test]
async fn flush_gives_unspent_units_back_into_their_window() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    for _ in 0..3 {
        r.check("hot", &p).await;
    }
    assert_eq!(r.shared_remaining("hot", &p).await, 92);
    assert_eq!(r.store.flush().await.unwrap(), 5);
    assert_eq!(r.shared_remaining("hot", &p).await, 97);
    assert_eq!(r.store.local_units(b"hot"), 0);
    // After shutdown, every check goes to the shared store as it is.
    r.store.shutdown().await.unwrap();
    let before = r.calls();
    r.check("hot", &p).await;
    r.check("hot", &p).await;
    assert_eq!(r.calls(), before + 2);
    assert_eq!(r.shared_remaining("hot", &p).await, 95);
}

#[tokio::test]
async fn a_refund_of_a_served_check_goes_back_into_its_lease() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.check("hot", &p).await;
    let d = r.check("hot", &p).await;
    assert_eq!(r.store.local_units(b"hot"), 6);
    r.store
        .refund(b"hot", &p, &d.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"hot"), 7, "back into the local lease");
    assert_eq!(
        r.shared_remaining("hot", &p).await,
        92,
        "not into the store"
    );
    // Once the window has ended, a refund changes nothing.
    let d = r.check("hot", &p).await;
    r.advance(S);
    r.store
        .refund(b"hot", &p, &d.receipt().unwrap())
        .await
        .unwrap();
    assert_eq!(r.store.local_units(b"hot"), 0);
}

#[tokio::test]
async fn blocks_grow_when_spent_and_shrink_when_units_expire() {
    let r = rig(1, 2, 16);
    let p = fixed(1_000);
    for _ in 0..40 {
        r.check("hot", &p).await;
    }
    // Blocks 2, 4, 8, 16, then capped at 16.
    assert_eq!(r.calls(), 5);
    assert_eq!(r.store.block_target(b"hot"), Some(16));
    r.advance(S);
    r.check("hot", &p).await;
    assert_eq!(
        r.store.block_target(b"hot"),
        Some(8),
        "the ended lease wasted units"
    );
}

/// Blocks halved down to the check's own cost (each window's lease
/// wasted all but one unit) still lease again when the key is busy, and
/// grow back: the target never traps a hot key on one inner call per
/// check (found by `benches/lease/` with `BENCH_REPEAT`: one process of
/// four stuck at a target of 1 after a burst of blocks lost at a window's
/// end, with 0.15–0.20 Redis commands per admitted check).
#[tokio::test]
async fn a_block_target_halved_to_the_cost_grows_back() {
    let r = rig(1, 2, 16);
    let p = fixed(1_000);
    // One check a window: a block of 2, one unit wasted, halved to 1.
    for _ in 0..4 {
        r.check("hot", &p).await;
        r.advance(S);
    }
    r.check("hot", &p).await;
    assert_eq!(r.store.block_target(b"hot"), Some(1));
    r.advance(S);
    let before = r.calls();
    for _ in 0..40 {
        assert!(r.check("hot", &p).await.allowed);
    }
    let calls = r.calls() - before;
    assert!(
        calls <= 8,
        "{calls} inner calls for 40 checks: the key never leased again"
    );
    assert_eq!(r.store.block_target(b"hot"), Some(16));
}
