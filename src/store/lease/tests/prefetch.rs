//! Prefetching: a key's next block is asked for in the background when its
//! lease is down to a quarter of its block, so its checks do not wait a
//! round trip for each block.

use std::future::Future;
use std::sync::atomic::Ordering;

use super::{fixed, rig_with, Rig};

/// Lets the spawned block calls run until `done` holds (a bounded number
/// of turns of this single-threaded runtime).
async fn settle_until(r: &Rig, done: impl Fn(&Rig) -> bool) {
    for _ in 0..100 {
        if done(r) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the background block never landed");
}

/// Six checks of a block of 8 leave 2 units, a quarter: the next block is
/// asked for; the shared store stalls it on its way.
async fn block_on_its_way(r: &Rig, p: &crate::policy::Policy) {
    for _ in 0..6 {
        assert!(r.check("hot", p).await.allowed);
    }
    r.stall.store(true, Ordering::SeqCst);
    settle_until(r, |r| r.calls() == 2).await;
}

fn resume(r: &Rig) {
    r.stall.store(false, Ordering::SeqCst);
    r.resume.notify_waiters();
}

#[tokio::test]
async fn the_next_block_is_taken_while_the_lease_still_serves() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    assert!(r.check("hot", &p).await.allowed, "the first block's check");
    assert_eq!((r.calls(), r.store.local_units(b"hot")), (1, 7));
    // Down to a quarter of the block (2 units): the next block is asked for
    // in the background. The shared store stalls it; the lease still serves.
    r.stall.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        assert!(r.check("hot", &p).await.allowed);
    }
    settle_until(&r, |r| r.calls() == 2).await;
    for _ in 0..2 {
        assert!(r.check("hot", &p).await.allowed);
    }
    assert_eq!(
        r.calls(),
        2,
        "served in process while the block is on its way"
    );
    // Spent out: a check waits for the block in flight, not asking itself.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut waiting = Box::pin(r.check("hot", &p));
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    assert_eq!(r.calls(), 2);
    resume(&r);
    let d = waiting.await;
    assert!(d.allowed);
    assert_eq!(r.calls(), 2, "served from the prefetched block");
    assert_eq!(r.store.local_units(b"hot"), 7);
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 16);
    // Both leases' units go back on a flush: here the second's 7.
    r.store.flush().await.unwrap();
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 9);
}

#[tokio::test]
async fn a_block_landing_after_shutdown_goes_back() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    block_on_its_way(&r, &p).await;
    // Shutdown gives the lease's 2 units back, then waits for the block.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut shutdown = Box::pin(r.store.shutdown());
    assert!(shutdown.as_mut().poll(&mut cx).is_pending());
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 6);
    resume(&r);
    // Charged on landing (8 more), then given back whole before shutdown
    // returns: nothing is leased after shutdown.
    assert_eq!(shutdown.await.unwrap(), 2, "the lease's 2 units");
    assert_eq!(r.store.local_units(b"hot"), 0);
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 6);
}

/// A block whose task never runs (its runtime shut down first) leaves no
/// mark: the key leases again, and a shutdown does not wait for it.
#[test]
fn a_prefetch_whose_task_never_runs_leaves_no_mark() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    let short_lived = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    short_lived.block_on(async {
        for _ in 0..6 {
            assert!(r.check("hot", &p).await.allowed);
        }
    });
    // The prefetch was spawned on that runtime and never polled.
    drop(short_lived);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        for _ in 0..2 {
            assert!(r.check("hot", &p).await.allowed);
        }
        // Spent out: a new block is asked for at once, not awaited forever
        // (the bound only turns a hang into a failure).
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), r.check("hot", &p));
        assert!(
            next.await
                .expect("waited for a block never asked for")
                .allowed
        );
        assert_eq!(r.calls(), 2);
        assert_eq!(r.store.shutdown().await.unwrap(), 7);
    });
}

#[tokio::test]
async fn without_prefetching_one_lease_is_held_at_a_time() {
    let r = rig_with(1, 8, 8, false);
    let p = fixed(100);
    for _ in 0..8 {
        assert!(r.check("hot", &p).await.allowed);
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(r.calls(), 1, "no block before the lease is spent");
    assert!(r.check("hot", &p).await.allowed);
    assert_eq!(r.calls(), 2);
}

/// A check served while a prefetched block waits reports the later block's
/// shared figure: what other processes took in between shows.
#[tokio::test]
async fn remaining_is_read_from_the_latest_block() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    assert!(r.check("hot", &p).await.allowed);
    // Another process takes 10 units.
    let other = crate::store::Charge::new(b"hot", &p, 10);
    assert!(
        crate::store::Store::check(&r.shared, other)
            .await
            .unwrap()
            .allowed
    );
    for _ in 0..5 {
        assert!(r.check("hot", &p).await.allowed);
    }
    settle_until(&r, |r| r.store.local_units(b"hot") == 2 + 8).await;
    // 100 - 8 - 10 - 8 shared, plus the 1 + 8 units this process holds.
    let d = r.check("hot", &p).await;
    assert_eq!(d.remaining, 74 + 9);
}

/// A charge the lease in hand is short of is served from the prefetched
/// block (a lease of its own), not sent to the store.
#[tokio::test]
async fn the_prefetched_block_serves_what_the_lease_in_hand_cannot() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    for _ in 0..6 {
        assert!(r.check("hot", &p).await.allowed);
    }
    settle_until(&r, |r| r.store.local_units(b"hot") == 2 + 8).await;
    let three = crate::store::Charge::new(b"hot", &p, 3);
    assert!(
        crate::store::Store::check(&r.store, three)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(r.calls(), 2, "no store call");
    assert_eq!(r.store.local_units(b"hot"), 2 + 5);
}

/// A key reset while its prefetched block is on its way: the block is not
/// leased, and nothing of it is refunded into the counts after the reset
/// (the reset may have cleared it already); the key leases again.
#[tokio::test]
async fn a_block_landing_after_a_reset_is_left_as_charged() {
    let r = rig_with(1, 8, 8, true);
    let p = fixed(100);
    block_on_its_way(&r, &p).await;
    crate::store::Store::reset(&r.store, b"hot", &p)
        .await
        .unwrap();
    resume(&r);
    settle_until(&r, |r| {
        r.store.shared.prefetching.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(r.store.local_units(b"hot"), 0);
    assert_eq!(
        r.shared_remaining("hot", &p).await,
        100 - 8,
        "charged after the reset"
    );
    assert!(r.check("hot", &p).await.allowed);
    assert_eq!(r.calls(), 3, "a new block");
}
