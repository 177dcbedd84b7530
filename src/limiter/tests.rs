//! The compositions of [`Limiter`]: rules, names, lock-outs, under a
//! manual clock.

use std::future::Future;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::policy::Policy;
use crate::store::Charge;

const MIN: Duration = Duration::from_secs(60);

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(f)
}

fn store() -> (ManualClock, MemoryStore<ManualClock>) {
    let clock = ManualClock::new();
    (clock.clone(), MemoryStore::builder().clock(clock).build())
}

fn penalty() -> Penalty {
    // Two denials within 10 minutes lock for 5.
    Penalty::new(2, 10 * MIN, 5 * MIN).unwrap()
}

async fn remaining(store: &MemoryStore<ManualClock>, key: &str, policy: &Policy) -> u64 {
    let peek = store.check(Charge::new(key.as_bytes(), policy, 0)).await;
    peek.unwrap().remaining
}

#[test]
fn rule_keys_are_prefix_key_unnamed_and_prefix_name_key_named() {
    let (_, store) = store();
    let minute = Policy::fixed_window(5, MIN).unwrap();
    let day = Policy::fixed_window(9, 24 * 60 * MIN).unwrap();
    block_on(async {
        let store = Arc::new(store);
        let one = Limiter::from_shared(store.clone(), minute).with_prefix("p");
        one.check("k").await.unwrap();
        assert_eq!(remaining(&store, "p:k", &minute).await, 4);
        let named = Limiter::from_shared(store.clone(), minute)
            .named("m")
            .with_prefix("p");
        named.check("k").await.unwrap();
        assert_eq!(remaining(&store, "p:m:k", &minute).await, 4);
        // Growing a limiter keeps its first rule's keys.
        let grown = Limiter::from_shared(store.clone(), minute)
            .with_prefix("p")
            .and("day", day);
        let d = grown.check("k").await.unwrap();
        assert_eq!(d.get("").unwrap().remaining, 3);
        assert_eq!(remaining(&store, "p:k", &minute).await, 3);
        assert_eq!(remaining(&store, "p:day:k", &day).await, 8);
        let names: Vec<&str> = grown.rules().map(|(n, _)| n).collect();
        assert_eq!(names, ["", "day"]);
    });
}

#[test]
fn a_lockout_over_two_rules_locks_the_caller_not_a_rule() {
    let (clock, store) = store();
    let minute = Policy::fixed_window(1, MIN).unwrap();
    let hour = Policy::fixed_window(10, 60 * MIN).unwrap();
    let l = Limiter::new(store, minute)
        .named("minute")
        .and("hour", hour)
        .lockout(penalty())
        .with_prefix("login");
    block_on(async {
        assert!(l.check("u").await.unwrap().allowed());
        let first = l.check("u").await.unwrap();
        assert_eq!(first.retry_after(), Some(MIN), "a plain denial");
        let second = l.check("u").await.unwrap();
        assert_eq!(second.retry_after(), Some(5 * MIN), "the strike that locks");
        assert!(second.iter().all(|(_, d)| d.retry_after == Some(5 * MIN)));
        assert_eq!(l.locked_for("u").await.unwrap(), Some(5 * MIN));
        // The minute passes; the lock holds and is not charged to the rules.
        clock.advance(2 * MIN);
        let locked = l.check("u").await.unwrap();
        assert_eq!(locked.retry_after(), Some(3 * MIN));
        assert_eq!(l.peek("u").await.unwrap().retry_after(), Some(3 * MIN));
        assert_eq!(l.locked_for("other").await.unwrap(), None);
        clock.advance(3 * MIN);
        let after = l.check("u").await.unwrap();
        assert!(after.allowed());
        assert_eq!(
            after.get("hour").unwrap().remaining,
            8,
            "locked checks took nothing"
        );
    });
}

#[test]
fn peeks_never_strike() {
    let (_, store) = store();
    let l = Limiter::new(store, Policy::fixed_window(1, MIN).unwrap()).lockout(penalty());
    block_on(async {
        assert!(l.check("u").await.unwrap().allowed);
        for _ in 0..5 {
            assert_eq!(l.peek("u").await.unwrap().remaining, 0);
        }
        assert_eq!(
            l.locked_for("u").await.unwrap(),
            None,
            "peeks are not strikes"
        );
        // Two denials still lock: the peeks took no strike.
        l.check("u").await.unwrap();
        let locked = l.check("u").await.unwrap();
        assert_eq!(locked.retry_after, Some(5 * MIN));
    });
}

#[test]
fn a_wait_that_ends_denied_is_one_strike_and_a_locked_key_waits_for_nothing() {
    let (_, store) = store();
    let l = Limiter::new(store, Policy::fixed_window(1, MIN).unwrap()).lockout(penalty());
    block_on(async {
        assert!(l.check("u").await.unwrap().allowed);
        let waited = l.wait("u", Duration::from_secs(1)).await.unwrap();
        assert!(!waited.allowed);
        assert_eq!(l.locked_for("u").await.unwrap(), None);
        let locking = l.wait("u", Duration::from_secs(1)).await.unwrap();
        assert_eq!(locking.retry_after, Some(5 * MIN));
        let start = tokio::time::Instant::now();
        let locked = l.wait("u", 10 * MIN).await.unwrap();
        assert_eq!(locked.retry_after, Some(5 * MIN));
        assert_eq!(start.elapsed(), Duration::ZERO, "no wait for a locked key");
    });
}

#[test]
fn check_with_and_acquire_honour_the_lock() {
    let (_, store) = store();
    let gold = Policy::fixed_window(3, MIN).unwrap();
    let l = Limiter::new(store, Policy::fixed_window(1, MIN).unwrap()).lockout(penalty());
    block_on(async {
        l.check("u").await.unwrap();
        l.check("u").await.unwrap();
        assert_eq!(l.check("u").await.unwrap().retry_after, Some(5 * MIN));
        let d = l.check_with("u", &gold, 1).await.unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, Some(5 * MIN)));
        let refused = l.acquire("u").await.unwrap().unwrap_err();
        assert_eq!(refused.retry_after, Some(5 * MIN));
    });
}

#[test]
fn a_store_that_cannot_keep_a_penalty_is_refused_before_traffic() {
    let (_, store) = store();
    // A store refusing sliding logs (as `CellStore` does) cannot count
    // strikes.
    struct NoLogs(MemoryStore<ManualClock>);
    impl Store for NoLogs {
        fn decide<'a>(
            &'a self,
            charges: &'a [Charge<'a>],
        ) -> crate::store::Answer<
            impl std::future::Future<Output = Result<crate::store::Decisions, StoreError>> + Send + 'a,
        > {
            self.0.decide(charges)
        }
        async fn refund(
            &self,
            key: &[u8],
            policy: &Policy,
            receipt: &crate::decision::Receipt,
        ) -> Result<(), StoreError> {
            self.0.refund(key, policy, receipt).await
        }
        async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
            self.0.reset(key, policy).await
        }
        fn validate(&self, rules: &[crate::store::RuleSpec<'_>]) -> Result<(), StoreError> {
            match rules.iter().any(|r| {
                matches!(
                    r.policy.algorithm(),
                    crate::policy::Algorithm::SlidingLog(_)
                )
            }) {
                true => Err(StoreError::Unsupported("sliding logs")),
                false => Ok(()),
            }
        }
    }
    let l = Limiter::new(NoLogs(store), Policy::fixed_window(1, MIN).unwrap());
    assert!(l.try_lockout(penalty()).is_err());
}

#[test]
fn a_wait_of_several_rules_reserves_its_gcra_slot_and_a_dropped_waiter_gives_it_back() {
    let (_, store) = store();
    let second = Policy::cell(0, 1, Duration::from_secs(1)).unwrap();
    let l = Limiter::new(store, second)
        .named("second")
        .and("minute", Policy::fixed_window(100, MIN).unwrap());
    let minute_left = |d: &RuleDecisions| d.get("minute").unwrap().remaining;
    block_on(async {
        assert!(l.wait("u", Duration::ZERO).await.unwrap().allowed());
        // The second rule's next slot is a second ahead: reserved at once
        // (the manual clock never moves), then slept for.
        let start = tokio::time::Instant::now();
        let reserved = l.wait("u", Duration::from_secs(2)).await.unwrap();
        assert!(reserved.allowed());
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert_eq!(minute_left(&reserved), 98);
        // The next slot, two seconds ahead, does not fit half a second:
        // denied at once, nothing charged on either rule.
        let start = tokio::time::Instant::now();
        let denied = l.wait("u", Duration::from_millis(500)).await.unwrap();
        assert!(!denied.allowed());
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(minute_left(&l.peek("u").await.unwrap()), 98);
        // A waiter dropped before its slot gives back both rules' units.
        let dropped = tokio::time::timeout(Duration::from_millis(100), l.wait("u", 5 * MIN));
        assert!(dropped.await.is_err(), "still sleeping for its slot");
        tokio::task::yield_now().await;
        assert_eq!(minute_left(&l.peek("u").await.unwrap()), 98);
        let start = tokio::time::Instant::now();
        assert!(l.wait("u", 5 * MIN).await.unwrap().allowed());
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(2),
            "the same slot again"
        );
    });
}
