//! A full memory store degrades gracefully: held keys keep their exact
//! limits, new keys share the rule's overflow state at the rule's own rate,
//! and a per-prefix cap keeps one flooded route from starving another.

use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy, StoreError};

const HOUR: Duration = Duration::from_secs(3600);

/// A small store on the manual clock, one shard, no janitor.
fn small_store(clock: &ManualClock, max_keys: usize) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        // The shared counters' lane: no eviction, one counter per rule.
        .evict_when_full(false)
        .overflow_buckets(1)
        .sweep_interval(None)
        .shards(1)
        .max_keys(max_keys)
        .build()
}

/// Fills `store` with `n` keys that stay live for an hour.
fn fill(store: &MemoryStore<ManualClock>, n: usize) -> Policy {
    let long = Policy::sliding_log(1_000, HOUR).unwrap();
    for i in 0..n {
        let key = format!("filler{i}");
        assert!(
            store
                .check_sync(Charge::new(key.as_bytes(), &long, 1))
                .unwrap()
                .allowed
        );
    }
    long
}

fn allowed(store: &MemoryStore<ManualClock>, key: &str, policy: &Policy) -> bool {
    store
        .check_sync(Charge::new(key.as_bytes(), policy, 1))
        .unwrap()
        .allowed
}

#[test]
fn held_keys_keep_their_exact_limits_when_the_store_is_full() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 4);
    let user = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let global = Policy::cell(9, 10, Duration::from_secs(1)).unwrap();
    assert!(allowed(&store, "user:alice", &user));
    assert!(allowed(&store, "route:global:", &global));
    fill(&store, 2);
    assert_eq!(store.len(), 4);
    // A flood of new keys on both policies...
    for i in 0..1_000 {
        store
            .check_sync(Charge::new(format!("user:{i}").as_bytes(), &user, 1))
            .unwrap();
        store
            .check_sync(Charge::new(format!("g{i}").as_bytes(), &global, 1))
            .unwrap();
    }
    assert!(store.is_full());
    assert_eq!(store.overflowed_checks(), 2_000);
    assert_eq!(store.len(), 4, "no live key evicted, none added");
    // ...leaves alice her 2 remaining requests, exactly, and the global
    // bucket its 9 remaining.
    assert!(allowed(&store, "user:alice", &user));
    assert!(allowed(&store, "user:alice", &user));
    assert!(!allowed(&store, "user:alice", &user));
    let admitted = (0..20)
        .filter(|_| allowed(&store, "route:global:", &global))
        .count();
    assert_eq!(admitted, 9);
}

#[test]
fn new_keys_share_the_overflow_state_at_exactly_the_rules_rate() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 4);
    fill(&store, 4);
    // One a second, no burst.
    let per_second = Policy::cell(0, 1, Duration::from_secs(1)).unwrap();
    let mut admitted = 0;
    let mut checks = 0;
    // Ten seconds of a flood: ten fresh keys every 100 ms.
    for step in 0..100 {
        for i in 0..10 {
            let key = format!("flood{step}-{i}");
            admitted += usize::from(allowed(&store, &key, &per_second));
            checks += 1;
        }
        clock.advance(Duration::from_millis(100));
    }
    assert_eq!(admitted, 10, "one a second over ten seconds, whoever asks");
    assert_eq!(store.overflowed_checks(), checks);
    assert_eq!(store.len(), 4);
    // Another policy has its own overflow state, at its own rate.
    let per_minute = Policy::sliding_log(3, Duration::from_secs(60)).unwrap();
    let other = (0..10)
        .filter(|i| allowed(&store, &format!("m{i}"), &per_minute))
        .count();
    assert_eq!(other, 3);
}

#[test]
fn new_keys_get_their_own_state_again_once_keys_go_cold() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 4);
    let per_second = Policy::cell(0, 1, Duration::from_secs(1)).unwrap();
    for i in 0..4 {
        assert!(allowed(&store, &format!("early{i}"), &per_second));
    }
    assert!(
        allowed(&store, "late0", &per_second),
        "the overflow state's one"
    );
    assert!(!allowed(&store, "late1", &per_second), "shared: spent");
    assert_eq!(store.overflowed_checks(), 2);
    clock.advance(Duration::from_secs(2)); // every key is cold
                                           // Each new key has a state of its own again: all admitted at one instant.
    for i in 0..4 {
        assert!(allowed(&store, &format!("new{i}"), &per_second));
    }
    assert_eq!(store.overflowed_checks(), 2, "none decided in overflow");
    assert_eq!(store.len(), 4);
    assert!(!allowed(&store, "new0", &per_second), "and its own limit");
}

#[test]
fn a_flooded_prefix_leaves_new_keys_of_other_prefixes_alone() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        // The shared counters' lane: no eviction, one counter per rule.
        .evict_when_full(false)
        .overflow_buckets(1)
        .sweep_interval(None)
        .shards(4)
        .max_keys(100)
        .max_keys_for("a:", 4)
        .max_keys_for("b:", 4)
        .max_keys_for("a:vip:", 2)
        .build();
    let p = Policy::cell(0, 1, HOUR).unwrap();
    let flood = (0..1_000)
        .filter(|i| allowed(&store, &format!("a:{i}"), &p))
        .count();
    assert_eq!(
        flood,
        4 + 1,
        "four keys of its own, then the overflow state's one"
    );
    assert_eq!(store.len(), 4);
    let flooded = store.overflowed_checks();
    // b: and unprefixed keys still get states of their own: each is admitted.
    for i in 0..4 {
        assert!(allowed(&store, &format!("b:{i}"), &p), "b:{i}");
    }
    for i in 0..50 {
        assert!(allowed(&store, &format!("other{i}"), &p), "other{i}");
    }
    // The longest prefix counts: a:vip: has its own room.
    assert!(allowed(&store, "a:vip:1", &p));
    assert!(allowed(&store, "a:vip:2", &p));
    assert_eq!(store.overflowed_checks(), flooded);
    assert_eq!(store.len(), 4 + 4 + 50 + 2);
    // b: overflows on its own state: a:'s spent overflow state does not deny it.
    assert!(allowed(&store, "b:overflow", &p));
    assert!(!allowed(&store, "b:overflow2", &p));
    assert!(!allowed(&store, "a:more", &p));
}

#[test]
fn multi_rule_checks_stay_all_or_nothing_across_held_keys_and_overflow() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 4);
    let user = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let ip = Policy::sliding_log(2, Duration::from_secs(60)).unwrap();
    assert!(allowed(&store, "user:alice", &user));
    assert!(allowed(&store, "user:bob", &user));
    fill(&store, 2);
    let both = |u: &str, i: &str| {
        let rules = [
            Charge::new(u.as_bytes(), &user, 1),
            Charge::new(i.as_bytes(), &ip, 1),
        ];
        store.check_all_sync(&rules).unwrap()
    };
    // Alice's own key and a new ip key (overflow): both charged.
    let d = both("user:alice", "ip:1");
    assert!(d.iter().all(|d| d.allowed));
    assert_eq!(d[0].remaining, 0);
    assert_eq!(d[1].remaining, 1, "the overflow state's own count");
    // Alice is spent: the overflow state is not charged.
    let d = both("user:alice", "ip:2");
    assert!(!d[0].allowed && d[1].allowed);
    assert_eq!(d[1].remaining, 1, "a peek of the unchanged overflow state");
    assert!(
        allowed(&store, "ip:3", &ip),
        "the overflow state's last unit"
    );
    // Now the overflow state denies: bob is not charged.
    let d = both("user:bob", "ip:4");
    assert!(d[0].allowed && !d[1].allowed);
    let peek = store
        .check_sync(Charge::new(b"user:bob", &user, 0))
        .unwrap();
    assert_eq!(peek.remaining, 1, "bob keeps his unit");
}

#[test]
fn rules_of_one_check_on_one_overflow_state_are_charged_together() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 1);
    fill(&store, 1);
    let p = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let pair = |a: &'static str, b: &'static str| {
        let rules = [
            Charge::new(a.as_bytes(), &p, 1),
            Charge::new(b.as_bytes(), &p, 1),
        ];
        store.check_all_sync(&rules).unwrap()
    };
    let d = pair("a", "b");
    assert!(d.iter().all(|d| d.allowed));
    assert_eq!((d[0].remaining, d[1].remaining), (2, 1));
    // One unit left, two asked for: neither is charged.
    let d = pair("c", "d");
    assert!(d.iter().all(|d| !d.allowed));
    assert!(allowed(&store, "e", &p));
    assert!(!allowed(&store, "f", &p));
}

#[test]
fn concurrency_permits_taken_in_overflow_are_released() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 2);
    fill(&store, 2);
    let c = Policy::concurrency(2).unwrap();
    let take = |key: &str| {
        store
            .check_sync(Charge::new(key.as_bytes(), &c, 1))
            .unwrap()
    };
    let first = take("job:1");
    let second = take("job:2");
    assert!(first.allowed && second.allowed);
    assert!(
        !take("job:3").allowed,
        "two in flight on the overflow state"
    );
    store.release_sync(b"job:1", &c, first.permit.unwrap());
    let third = take("job:3");
    assert!(third.allowed, "the released permit is free again");
    assert!(!take("job:4").allowed);
    // Through a multi-rule check too.
    store.release_sync(b"job:2", &c, second.permit.unwrap());
    let other = Policy::concurrency(5).unwrap();
    let rules = [Charge::new(b"job:5", &c, 1), Charge::new(b"x:5", &other, 1)];
    let d = store.check_all_sync(&rules).unwrap();
    assert!(d.iter().all(|d| d.allowed));
    store.release_sync(b"job:5", &c, d[0].permit.unwrap());
    store.release_sync(b"job:3", &c, third.permit.unwrap());
    assert!(take("job:6").allowed && take("job:7").allowed);
    assert_eq!(store.len(), 2);
}

#[test]
fn only_a_policy_per_request_can_still_make_the_store_answer_full() {
    let clock = ManualClock::new();
    let store = small_store(&clock, 1);
    fill(&store, 1);
    let policy = |n: u64| Policy::cell(0, n, HOUR).unwrap();
    for n in 1..=1_024 {
        assert!(allowed(&store, &format!("k{n}"), &policy(n)), "{n}");
    }
    let err = store
        .check_sync(Charge::new(b"k1025", &policy(1_025), 1))
        .unwrap_err();
    assert!(matches!(err, StoreError::Full { max_keys: 1 }), "{err:?}");
    // Held overflow states keep working; cold ones make room.
    assert!(!allowed(&store, "k1", &policy(1)));
    clock.advance(2 * HOUR);
    assert!(allowed(&store, "k1025", &policy(1_025)));
}
