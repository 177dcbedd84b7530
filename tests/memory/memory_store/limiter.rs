//! The `Limiter` API directly: permits released on drop, leases freeing a crashed holder's permit.

use std::time::Duration;

use super::manual_store;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, MemoryStore, Policy};

#[tokio::test]
async fn limiter_direct_api() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let reply = Limiter::new(
        store.clone(),
        Policy::sliding_log(5, Duration::from_secs(60)).unwrap(),
    )
    .with_prefix("reply");
    let mut receipts = Vec::new();
    for i in 0..5 {
        let d = reply.check("laoqian").await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 4 - i);
        receipts.extend(d.receipt());
    }
    assert!(!reply.check("laoqian").await.unwrap().allowed);
    assert!(
        reply.check("someone-else").await.unwrap().allowed,
        "keys are isolated"
    );
    let peek = reply.peek("laoqian").await.unwrap();
    assert!(peek.allowed, "a peek is never a denial");
    assert_eq!(peek.remaining, 0);
    for receipt in &receipts[..2] {
        reply.refund("laoqian", receipt).await.unwrap();
    }
    assert_eq!(reply.peek("laoqian").await.unwrap().remaining, 2);
    reply.reset("laoqian").await.unwrap();
    assert_eq!(reply.peek("laoqian").await.unwrap().remaining, 5);
    assert!(!reply.check_n("laoqian", 6).await.unwrap().allowed);
    // The prefix separates limiters sharing one store.
    let post = Limiter::new(
        store,
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    )
    .with_prefix("post");
    assert!(post.check("laoqian").await.unwrap().allowed);
}

#[tokio::test]
async fn permits_release_on_drop() {
    let limiter = Limiter::new(MemoryStore::new(), Policy::concurrency(2).unwrap());
    let a = limiter.acquire("upload").await.unwrap().unwrap();
    let b = limiter.acquire("upload").await.unwrap().unwrap();
    let denied = limiter.acquire("upload").await.unwrap().unwrap_err();
    assert!(!denied.allowed);
    drop(a);
    // One finishing holder frees exactly one permit (the @EntryTimes bug freed all).
    let c = limiter.acquire("upload").await.unwrap().unwrap();
    assert!(limiter.acquire("upload").await.unwrap().is_err());
    b.release().await.unwrap();
    drop(c);
    assert_eq!(limiter.peek("upload").await.unwrap().remaining, 2);
}

#[test]
fn lease_frees_a_permit_whose_holder_crashed() {
    let clock = ManualClock::new();
    let store = manual_store(&clock);
    let p = Policy::concurrency_with_lease(1, Duration::from_secs(30)).unwrap();
    assert!(store.check_sync(Charge::new(b"k", &p, 1)).unwrap().allowed);
    let d = store.check_sync(Charge::new(b"k", &p, 1)).unwrap();
    assert_eq!(d.retry_after, Some(Duration::from_secs(30)));
    clock.advance(Duration::from_secs(30));
    assert!(store.check_sync(Charge::new(b"k", &p, 1)).unwrap().allowed);
}
