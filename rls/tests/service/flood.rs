//! A flood of distinct `user` values against the memory store at its cap
//! (`RLS_MEMORY_MAX_KEYS=1000`), over gRPC: 1,200 users one request each,
//! then 10 brand-new users. Before the hashed shared counters, every key
//! beyond the cap shared one counter per rule, and the 10 new users were all
//! OVER_LIMIT. Time is frozen, so every request falls in one window.
//!
//! What each store setting gives under larger floods is measured by
//! `rls/examples/rls_flood.rs` (BENCHMARKS.md, "A flood of new keys").

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::BoxStore;
use tower_throttle::MemoryStore;

use crate::support::*;

const FIXED: &str = "domain: flood\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const SLIDING_LOG: &str = "domain: flood\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_log}\n";
const CAP: &[(&str, &str)] = &[("RLS_MEMORY_MAX_KEYS", "1000")];
const FLOOD: usize = 1_200;
const NEW: usize = 10;

async fn ask_user(rls: &mut Rls, user: &str) -> RateLimitResponse {
    rls.ask("flood", vec![d(&[("user", user)])]).await
}

/// Whether `user`'s request was OVER_LIMIT (a status of each kind).
async fn over(rls: &mut Rls, user: &str) -> bool {
    let r = ask_user(rls, user).await;
    assert_eq!(r.statuses.len(), 1);
    assert!([OK, OVER].contains(&r.overall_code), "{r:?}");
    r.overall_code == OVER
}

/// `user` sends 5 requests, all OK, then a sixth, OVER_LIMIT.
async fn spend(rls: &mut Rls, user: &str) {
    for left in (0..5).rev() {
        assert_eq!(codes(&ask_user(rls, user).await), vec![(OK, left)]);
    }
    assert!(over(rls, user).await, "the sixth request of the window");
}

/// 1,200 distinct users, one request each: how many were OVER_LIMIT.
async fn flood(rls: &mut Rls, run: usize) -> usize {
    let mut refused = 0;
    for i in 0..FLOOD {
        refused += usize::from(over(rls, &format!("run{run}-user{i}")).await);
    }
    refused
}

/// 10 users never seen before, one request each: how many were OVER_LIMIT.
async fn new_users(rls: &mut Rls, run: usize) -> usize {
    let mut refused = 0;
    for i in 0..NEW {
        refused += usize::from(over(rls, &format!("run{run}-new{i}")).await);
    }
    refused
}

/// The scenario on upstream's fixed window, twice (each run on a
/// server of its own, so on a store of its own hash seed): at most 1 of 10
/// new users is refused, and every one of the 200 keys beyond the cap was
/// decided on a shared counter (the store evicts no key by default).
#[tokio::test]
async fn a_flood_of_new_users_does_not_lock_out_new_ones() {
    for run in 0..2 {
        let mut rls = Rls::start(&[("flood.yaml", FIXED)], CAP).await;
        let flood_refused = flood(&mut rls, run).await;
        let memory = rls.running().memory.clone().expect("the memory backend");
        assert_eq!(memory.overflowed_checks(), (FLOOD - 1_000) as u64);
        assert_eq!(memory.evicted_keys(), 0, "the default store evicts nothing");
        assert!(
            flood_refused <= 1,
            "run {run}: {flood_refused} of the flood's {FLOOD} first requests refused"
        );
        let refused = new_users(&mut rls, run).await;
        assert!(
            refused <= 1,
            "run {run}: {refused} of {NEW} new users OVER_LIMIT after the flood"
        );
        rls.stop().await;
    }
}

/// The same on a limit the store enforces itself (the `sliding_log`
/// extension), with a user who spent its 5 before the flood: it is still
/// OVER_LIMIT after it.
#[tokio::test]
async fn a_user_who_spent_its_limit_keeps_it_through_the_flood() {
    for run in 0..2 {
        let mut rls = Rls::start(&[("flood.yaml", SLIDING_LOG)], CAP).await;
        spend(&mut rls, "spender").await;
        let flood_refused = flood(&mut rls, run).await;
        let memory = rls.running().memory.clone().expect("the memory backend");
        assert!(memory.is_full(), "the flood filled the store");
        assert!(
            flood_refused <= 1,
            "run {run}: {flood_refused} of the flood's {FLOOD} requests refused"
        );
        assert!(
            over(&mut rls, "spender").await,
            "run {run}: the spender got its limit back after the flood"
        );
        let refused = new_users(&mut rls, run).await;
        assert!(
            refused <= 1,
            "run {run}: {refused} of {NEW} new users OVER_LIMIT after the flood"
        );
        assert!(
            over(&mut rls, "spender").await,
            "run {run}: the spender got its limit back after the new users"
        );
        rls.stop().await;
    }
}

/// The control: the scenario on a store set as before the change (one
/// shared counter per rule, no eviction) refuses all 10 new users, as the
/// issue reported; so the tests above see the flood the issue saw.
#[tokio::test]
async fn one_shared_counter_refused_every_new_user() {
    let dir = Dir::new();
    dir.write("flood.yaml", FIXED);
    let settings = settings(&dir, CAP);
    let store = MemoryStore::builder()
        .clock(ManualClock::starting_at(T0 * 1_000_000_000))
        .max_keys(1_000)
        .evict_when_full(false)
        .overflow_buckets(1)
        .build();
    let mut rls = Rls::start_hooked(dir, &settings, Some(BoxStore::new(store.clone()))).await;
    let flood_refused = flood(&mut rls, 0).await;
    assert_eq!(
        flood_refused,
        FLOOD - 1_000 - 5,
        "all but the first 5 of the 200 keys beyond the cap"
    );
    assert_eq!(store.overflowed_checks(), (FLOOD - 1_000) as u64);
    assert_eq!(store.evicted_keys(), 0);
    assert_eq!(new_users(&mut rls, 0).await, NEW);
    rls.stop().await;
}

/// Upstream's fixed window counts on a counter whose limit the store never
/// reaches (2^50; the verdict is taken from the count), so to the store a
/// user who spent its 5 has room like any other: an evicting store took
/// such keys (4-29 of 100 spenders got 5 more in the same minute). The
/// default store evicts nothing, and no spender is admitted again.
#[tokio::test]
async fn a_spent_user_keeps_its_limit_through_the_flood_on_a_fixed_window() {
    let mut rls = Rls::start(&[("flood.yaml", FIXED)], CAP).await;
    for s in 0..100 {
        spend(&mut rls, &format!("spender{s}")).await;
    }
    flood(&mut rls, 0).await;
    let mut readmitted = Vec::new();
    for s in 0..100 {
        let user = format!("spender{s}");
        if !over(&mut rls, &user).await {
            readmitted.push(user);
        }
    }
    assert!(
        readmitted.is_empty(),
        "spent users admitted again after the flood: {readmitted:?}"
    );
    rls.stop().await;
}
