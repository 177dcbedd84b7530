use std::future::Future;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::store::MemoryStore;
use crate::Limiter;

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

const MIN: Duration = Duration::from_secs(60);

/// 2 a minute (sliding log); 3 denials within 10 minutes lock for 5 minutes.
fn limiter() -> (ManualClock, Limiter<MemoryStore<ManualClock>>) {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::new(store, Policy::sliding_log(2, MIN).unwrap())
        .lockout(Penalty::new(3, 10 * MIN, 5 * MIN).unwrap())
        .with_prefix("login");
    (clock, limiter)
}

#[test]
fn the_third_denial_locks_the_key_for_the_whole_lock() {
    let (clock, l) = limiter();
    block_on(async {
        assert!(l.check("u").await.unwrap().allowed);
        assert!(l.check("u").await.unwrap().allowed);
        let first = l.check("u").await.unwrap();
        assert!(!first.allowed);
        assert_eq!(first.retry_after, Some(MIN), "a plain denial");
        assert_eq!(l.locked_for("u").await.unwrap(), None);
        assert!(!l.check("u").await.unwrap().allowed);
        let third = l.check("u").await.unwrap();
        assert_eq!((third.allowed, third.remaining), (false, 0));
        assert_eq!(third.retry_after, Some(5 * MIN));
        assert_eq!(third.retry_after_secs(), Some(300));
        // The rule's window passes; the lock holds, and counts down.
        clock.advance(2 * MIN);
        let d = l.check("u").await.unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, Some(3 * MIN)));
        assert_eq!(l.locked_for("u").await.unwrap(), Some(3 * MIN));
        // Locked checks are not charged: the rule is fresh when the lock ends.
        let peek = l.store().check(Charge::new(b"login:u", l.policy(), 0));
        assert_eq!(peek.await.unwrap().remaining, 2);
        clock.advance(3 * MIN);
        assert_eq!(l.locked_for("u").await.unwrap(), None);
        assert!(l.check("u").await.unwrap().allowed);
        assert!(l.check("u").await.unwrap().allowed);
        // Strikes started over with the lock: one denial does not relock.
        let d = l.check("u").await.unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, Some(MIN)));
    });
}

#[test]
fn strikes_older_than_the_window_do_not_count() {
    let (clock, l) = limiter();
    block_on(async {
        for _ in 0..2 {
            l.check("u").await.unwrap();
        }
        assert!(!l.check("u").await.unwrap().allowed);
        assert!(!l.check("u").await.unwrap().allowed);
        clock.advance(10 * MIN);
        for _ in 0..2 {
            assert!(l.check("u").await.unwrap().allowed);
        }
        let d = l.check("u").await.unwrap();
        assert_eq!(d.retry_after, Some(MIN), "the two old strikes lapsed");
        assert_eq!(l.locked_for("u").await.unwrap(), None);
    });
}

#[test]
fn keys_are_locked_apart_and_unlock_lifts_a_lock() {
    let (_clock, l) = limiter();
    block_on(async {
        for _ in 0..5 {
            l.check("u").await.unwrap();
        }
        assert_eq!(l.locked_for("u").await.unwrap(), Some(5 * MIN));
        assert!(l.check("v").await.unwrap().allowed, "another key");
        l.unlock("u").await.unwrap();
        assert_eq!(l.locked_for("u").await.unwrap(), None);
        // The quota is untouched by unlock, and reset forgets it too.
        assert_eq!(l.check("u").await.unwrap().retry_after, Some(MIN));
        l.reset("u").await.unwrap();
        assert!(l.check("u").await.unwrap().allowed);
    });
}

#[test]
fn the_hooks_work_without_the_limiter() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let penalty = Penalty::new(1, MIN, Duration::from_secs(30))
        .unwrap()
        .with_prefix("pb");
    assert_eq!(block_on(penalty.check_locked(&store, b"k")).unwrap(), None);
    let lock = block_on(penalty.record_denial(&store, b"k")).unwrap();
    assert_eq!(lock, Some(Duration::from_secs(30)));
    clock.advance(Duration::from_secs(10));
    let left = block_on(penalty.check_locked(&store, b"k")).unwrap();
    assert_eq!(left, Some(Duration::from_secs(20)));
    // A second denial while locked does not extend the lock.
    let again = block_on(penalty.record_denial(&store, b"k")).unwrap();
    assert_eq!(again, Some(Duration::from_secs(20)));
    let p = Policy::fixed_window(7, MIN).unwrap();
    let d = penalty.locked(&p, Duration::from_secs(20));
    assert_eq!(
        (d.allowed, d.limit, d.retry_after_secs()),
        (false, 7, Some(20))
    );
}

#[test]
fn zero_counts_and_durations_are_refused() {
    assert!(Penalty::new(0, MIN, MIN).is_err());
    assert!(Penalty::new(1, Duration::ZERO, MIN).is_err());
    assert!(Penalty::new(1, MIN, Duration::ZERO).is_err());
}
