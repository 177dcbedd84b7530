//! A block in flight: dropped callers, and checks that wait for it.

use std::future::Future;
use std::sync::atomic::Ordering;

use super::*;

/// A check dropped while its block is asked for (a caller's timeout) does
/// not leave the key unable to lease.
#[tokio::test]
async fn a_block_dropped_in_flight_does_not_stop_the_key_leasing() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    {
        let mut asking = std::pin::pin!(r.check("hot", &p));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(asking.as_mut().poll(&mut cx).is_pending());
    }
    r.stall.store(false, Ordering::SeqCst);
    r.check("hot", &p).await;
    assert_eq!(r.store.local_units(b"hot"), 7);
}

/// Checks of a key whose block is on its way wait for it: one store call
/// for the block, not one per check meanwhile.
#[tokio::test]
async fn checks_wait_for_the_block_in_flight_instead_of_asking_the_store() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut first = std::pin::pin!(r.check("hot", &p));
    assert!(first.as_mut().poll(&mut cx).is_pending());
    let mut waiting: Vec<_> = (0..3).map(|_| Box::pin(r.check("hot", &p))).collect();
    for check in &mut waiting {
        assert!(check.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(r.calls(), 1, "only the block was asked for");
    r.stall.store(false, Ordering::SeqCst);
    r.resume.notify_waiters();
    assert!(first.await.allowed);
    for check in waiting {
        assert!(check.await.allowed);
    }
    assert_eq!(r.calls(), 1);
    assert_eq!(r.store.local_units(b"hot"), 8 - 4);
    assert_eq!(r.shared_remaining("hot", &p).await, 100 - 8);
}

/// A block that fails wakes its waiters, which then ask the store
/// themselves: nobody waits for a block that never comes.
#[tokio::test]
async fn waiters_go_on_when_the_block_is_dropped() {
    let r = rig(1, 8, 8);
    let p = fixed(100);
    r.stall.store(true, Ordering::SeqCst);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut waiter = Box::pin(r.check("hot", &p));
    {
        let mut first = std::pin::pin!(r.check("hot", &p));
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(waiter.as_mut().poll(&mut cx).is_pending());
        // The block's caller gives up (a timeout): dropped here.
    }
    r.stall.store(false, Ordering::SeqCst);
    r.resume.notify_waiters();
    assert!(waiter.await.allowed);
    // The waiter took a block of its own.
    assert_eq!(r.calls(), 2);
    assert_eq!(r.store.local_units(b"hot"), 7);
}
