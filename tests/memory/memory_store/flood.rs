//! A flood of new keys cannot lock out new clients. A full store first
//! sweeps keys at rest, then (when asked) evicts the least used live key of
//! a sample (never one at its limit, never lock-out state, never a
//! concurrency key, never a key of the same check), and otherwise decides a
//! new key on the shared counter its hash picks, one of 1,024 per rule.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

const MINUTE: Duration = Duration::from_secs(60);

fn store(clock: &ManualClock, max_keys: usize, evict: bool) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .max_keys(max_keys)
        .evict_when_full(evict)
        .build()
}

fn allowed(store: &MemoryStore<ManualClock>, key: &str, policy: &Policy) -> bool {
    let charge = Charge::new(key.as_bytes(), policy, 1);
    store.check_sync(charge).unwrap().allowed
}

/// The attack of the issue: a cap of 1,000 keys, 1,200 distinct users on
/// 5 replies a minute, then 10 brand-new users: at most 1 of 10 refused
/// (it was 10 of 10), with eviction (the default) and with the shared
/// counters alone. Run for every algorithm that counts requests.
#[test]
fn a_flood_of_new_keys_does_not_lock_out_new_clients() {
    let policies = [
        Policy::sliding_log(5, MINUTE).unwrap(),
        Policy::fixed_window(5, MINUTE).unwrap(),
        Policy::sliding_window(5, MINUTE).unwrap(),
        Policy::cell(4, 5, MINUTE).unwrap(),
    ];
    for policy in policies {
        for evict in [true, false] {
            let clock = ManualClock::new();
            let store = store(&clock, 1_000, evict);
            for i in 0..1_200 {
                allowed(&store, &format!("flood{i}"), &policy);
            }
            assert!(store.is_full());
            let refused = (0..10)
                .filter(|i| !allowed(&store, &format!("new{i}"), &policy))
                .count();
            assert!(
                refused <= 1,
                "{policy:?}, evict {evict}: {refused} of 10 refused"
            );
            assert!(store.len() <= 1_000);
            // Each key beyond the cap evicted a key of its shard (one with
            // no candidate went to a shared counter), or, without eviction,
            // went to a shared counter.
            let beyond = store.evicted_keys() + store.overflowed_checks();
            assert_eq!(beyond, 210, "{policy:?}, evict {evict}");
            if evict {
                assert!(
                    store.evicted_keys() >= 190,
                    "{policy:?}: {}",
                    store.evicted_keys()
                );
            } else {
                assert_eq!(store.evicted_keys(), 0);
            }
        }
    }
}

/// Evictions and shared counters are logged for the on-call engineer: a
/// warning the first time and then at most one a minute per namespace,
/// naming counts and the prefix, never a key.
#[test]
fn evictions_and_shared_counters_are_logged_once_a_minute() {
    // The binary's global subscriber (a scoped one can miss events whose
    // callsite another thread cached as uninteresting); this test's own
    // prefix tells its warnings from other tests'.
    let capture = crate::capture::Capture::install();
    let ours = |capture: &crate::capture::Capture| {
        capture.count_all(tracing::Level::WARN, &["evicting", "logged-once:"])
    };
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .shards(1)
        .max_keys_for("logged-once:", 4)
        .evict_when_full(true)
        .build();
    let policy = Policy::sliding_log(2, MINUTE).unwrap();
    for i in 0..50 {
        allowed(&store, &format!("logged-once:key{i}"), &policy);
    }
    assert!(store.evicted_keys() > 1);
    assert_eq!(ours(&capture), 1, "{}", capture.dump());
    clock.advance(MINUTE);
    for i in 50..100 {
        allowed(&store, &format!("logged-once:key{i}"), &policy);
    }
    assert_eq!(ours(&capture), 2, "{}", capture.dump());
    assert!(!capture.dump().contains("key1"), "a key was logged");
}

/// A key at its limit is never evicted: a spammer who spent the quota
/// stays refused through any flood, and when every held key is spent a
/// new key goes to the shared counters instead.
#[test]
fn a_key_at_its_limit_is_never_evicted() {
    let clock = ManualClock::new();
    let store = store(&clock, 4, true);
    let policy = Policy::sliding_log(2, MINUTE).unwrap();
    for i in 0..4 {
        let key = format!("spammer{i}");
        assert!(allowed(&store, &key, &policy));
        assert!(allowed(&store, &key, &policy));
        assert!(!allowed(&store, &key, &policy));
    }
    for i in 0..100 {
        allowed(&store, &format!("flood{i}"), &policy);
    }
    assert_eq!(store.evicted_keys(), 0);
    assert_eq!(store.overflowed_checks(), 100);
    for i in 0..4 {
        assert!(
            !allowed(&store, &format!("spammer{i}"), &policy),
            "spammer{i} forgotten"
        );
    }
}

/// Lock-out state and concurrency keys are never evicted: a lock holds,
/// and a permit taken is still there to release.
#[test]
fn lockout_state_and_concurrency_keys_are_never_evicted() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .max_keys(2)
        .max_penalty_keys(2)
        .evict_when_full(true)
        .build();
    let lock = Policy::sliding_log(1, MINUTE).unwrap();
    let locked = store
        .check_sync(Charge::new(b"lock:eve", &lock, 1).of_penalty())
        .unwrap();
    assert!(locked.allowed);
    let permits = Policy::concurrency(5).unwrap();
    for key in [&b"c1"[..], b"c2"] {
        assert!(
            store
                .check_sync(Charge::new(key, &permits, 1))
                .unwrap()
                .allowed
        );
    }
    for i in 0..50 {
        let key = format!("c-flood{i}");
        store
            .check_sync(Charge::new(key.as_bytes(), &permits, 1))
            .unwrap();
    }
    assert_eq!(store.evicted_keys(), 0);
    for i in 0..50 {
        let key = format!("l-flood{i}");
        let _ = store.check_sync(Charge::new(key.as_bytes(), &lock, 1).of_penalty());
    }
    let again = store
        .check_sync(Charge::new(b"lock:eve", &lock, 1).of_penalty())
        .unwrap();
    assert!(!again.allowed, "the lock was forgotten");
    assert_eq!(store.evicted_keys(), 0);
}

/// A multi-rule check never evicts a key of its own: with one shard and
/// room for two keys, a check on a held key and a new one evicts the
/// other held key, not its own.
#[test]
fn a_multi_rule_check_never_evicts_its_own_key() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .shards(1)
        .max_keys(2)
        .evict_when_full(true)
        .build();
    let policy = Policy::fixed_window(10, MINUTE).unwrap();
    assert!(allowed(&store, "mine", &policy));
    assert!(allowed(&store, "other", &policy));
    let rules = [
        Charge::new(b"mine", &policy, 1),
        Charge::new(b"new", &policy, 1),
    ];
    let decisions = store.check_all_sync(&rules).unwrap();
    assert!(decisions.iter().all(|d| d.allowed));
    assert_eq!(decisions[0].remaining, 8, "mine kept its count");
    assert_eq!(store.evicted_keys(), 1);
    let peek = store.check_sync(Charge::new(b"other", &policy, 0)).unwrap();
    assert_eq!(peek.remaining, 10, "other was the one evicted");
}

fn flood_ops() -> impl Strategy<Value = Vec<(u16, bool)>> {
    // (key, whether the clock moves a second first); few keys, so keys
    // come back after being evicted.
    proptest::collection::vec((0..40u16, proptest::bool::weighted(0.05)), 1..400)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// What eviction gives away, bounded: whatever the order of requests,
    /// each eviction hands back fewer units than the limit (what the key
    /// had used), so the admissions of one fixed window are at most the
    /// limit per key plus `limit − 1` per eviction in that window; without
    /// evictions, exactly the limit per key. The store never holds more
    /// than its cap.
    #[test]
    fn each_eviction_gives_back_less_than_the_limit(ops in flood_ops()) {
        const LIMIT: u64 = 3;
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .sweep_interval(None)
            .shards(2)
            .max_keys(8)
            .evict_when_full(true)
            .build();
        let policy = Policy::fixed_window(LIMIT, MINUTE).unwrap();
        // Per window: admissions per key, and evictions at its start.
        let mut admitted: HashMap<u64, HashMap<u16, u64>> = HashMap::new();
        let mut evicted_before: HashMap<u64, u64> = HashMap::new();
        for (key, tick) in ops {
            if tick {
                clock.advance(Duration::from_secs(1));
            }
            let window = clock.now_ns() / 60_000_000_000;
            evicted_before.entry(window).or_insert(store.evicted_keys());
            let ok = allowed(&store, &format!("k{key}"), &policy);
            *admitted.entry(window).or_default().entry(key).or_default() += u64::from(ok);
            let evictions = store.evicted_keys() - evicted_before[&window];
            let keys = &admitted[&window];
            let over: u64 = keys.values().map(|&n| n.saturating_sub(LIMIT)).sum();
            prop_assert!(
                over <= (LIMIT - 1) * evictions,
                "{} admissions over the limit with {} evictions", over, evictions
            );
            prop_assert!(store.overflowed_checks() > 0 || keys.values().all(|&n| n <= LIMIT) || evictions > 0);
            prop_assert!(store.len() <= 8);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// By default (no eviction) no key is ever admitted beyond its limit,
    /// however the keys cycle past the cap: a key's own requests are part
    /// of what its shared counter counts.
    #[test]
    fn by_default_no_key_passes_its_limit(ops in flood_ops()) {
        const LIMIT: u64 = 3;
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .sweep_interval(None)
            .shards(2)
            .max_keys(8)
            .overflow_buckets(4)
            .build();
        let policy = Policy::fixed_window(LIMIT, MINUTE).unwrap();
        let mut admitted: HashMap<(u64, u16), u64> = HashMap::new();
        for (key, tick) in ops {
            if tick {
                clock.advance(Duration::from_secs(1));
            }
            let window = clock.now_ns() / 60_000_000_000;
            if allowed(&store, &format!("k{key}"), &policy) {
                let n = admitted.entry((window, key)).or_default();
                *n += 1;
                prop_assert!(*n <= LIMIT, "k{} admitted {} times in a window", key, n);
            }
            prop_assert!(store.len() <= 8);
        }
        prop_assert_eq!(store.evicted_keys(), 0);
    }
}
