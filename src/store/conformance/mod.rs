//! The store conformance suite: what every [`Store`] must do, checked
//! against slow, obviously-correct reference models ([`model`]). Feature
//! `conformance`.
//!
//! A store author (Postgres, DynamoDB, …) runs it by describing the store
//! as a [`Subject`] (how to move its clock, what it supports) and calling
//! [`run`]: one call, which panics with the store's name and the first
//! difference from the model. Every store of this crate passes it
//! (`tests/conformance.rs`). The suite covers:
//!
//! * **exact decisions** — a seeded walk of checks (peeks included where
//!   supported), refunds, resets and releases over time, each decision equal
//!   to the model's, for every supported algorithm;
//! * **all or nothing** — a multi-rule check that one rule denies charges
//!   nothing;
//! * **concurrency permits** — distinct ids, denial at the limit, release;
//! * **expiry** — a key left alone for its window is fresh again;
//! * **typed errors** — bad requests and unsupported policies are
//!   `StoreError`s, never panics.
//!
//! ```
//! use tower_throttle::clock::ManualClock;
//! use tower_throttle::store::conformance::{run, Caps, Subject};
//! use tower_throttle::MemoryStore;
//!
//! let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
//! let store = MemoryStore::builder().clock(clock.clone()).build();
//! let (advance, now) = (clock.clone(), clock);
//! let subject = Subject {
//!     name: "MemoryStore",
//!     store,
//!     advance: Box::new(move |d| advance.advance(d)),
//!     now_ns: Box::new(move || tower_throttle::clock::Clock::now_ns(&now)),
//!     caps: Caps::FULL,
//!     key_prefix: "conformance".into(),
//! };
//! tokio::runtime::Builder::new_current_thread()
//!     .build()
//!     .unwrap()
//!     .block_on(run(&subject));
//! ```

pub mod model;

use std::time::Duration;

use crate::decision::{Decision, Receipt};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, Store, StoreError};

use self::model::Model;

/// What a store supports beyond plain checks.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Sliding logs, windows and concurrency (not only GCRA).
    pub all_algorithms: bool,
    /// GCRA only as `Policy::cell` builds it (redis-cell takes its own
    /// arguments; the other GCRA constructors are refused as config errors).
    pub cell_only: bool,
    /// Checks of cost 0 report without charging.
    pub peek: bool,
    /// `refund` gives units back.
    pub refund: bool,
    /// `reset` forgets a key.
    pub reset: bool,
    /// `check_all` over several rules.
    pub multi_rule: bool,
    /// `reset_after` equals the model's; otherwise it is only an upper bound.
    pub exact_reset: bool,
    /// The store's clock resolution: the model sees times rounded down to it.
    pub resolution: Duration,
}

impl Caps {
    /// Everything, at nanosecond resolution (the memory store).
    pub const FULL: Caps = Caps {
        all_algorithms: true,
        cell_only: false,
        peek: true,
        refund: true,
        reset: true,
        multi_rule: true,
        exact_reset: true,
        resolution: Duration::from_nanos(1),
    };
}

/// A store under test and the clock it decides on.
pub struct Subject<S> {
    /// For messages.
    pub name: &'static str,
    /// The store.
    pub store: S,
    /// Moves the store's clock forward.
    pub advance: Box<dyn Fn(Duration) + Send + Sync>,
    /// The store's clock now, in ns (absolute where windows align to it).
    pub now_ns: Box<dyn Fn() -> u64 + Send + Sync>,
    /// What the store supports.
    pub caps: Caps,
    /// Prefixes every key, so runs on one shared server do not meet.
    pub key_prefix: String,
}

/// Runs the whole suite; panics with the subject's name on a difference.
pub async fn run<S: Store>(subject: &Subject<S>) {
    for (name, policy) in policies(subject.caps) {
        model_walk(subject, name, &policy).await;
        expiry(subject, name, &policy).await;
    }
    if subject.caps.multi_rule {
        all_or_nothing(subject).await;
    }
    if subject.caps.all_algorithms {
        concurrency_permits(subject).await;
    }
    typed_errors(subject).await;
}

/// The parts that need no control over the store's clock, for stores that
/// decide on a server clock of their own (redis-cell's): a burst admitted
/// exactly, and typed errors.
pub async fn untimed<S: Store>(subject: &Subject<S>) {
    for (name, policy) in policies(subject.caps) {
        let key = key(subject, name, "burst");
        let limit = policy.limit();
        for i in 0..limit {
            let d = subject
                .store
                .check(Charge::new(&key, &policy, 1))
                .await
                .unwrap();
            assert!(
                d.allowed,
                "{} / {name}: unit {i} of the burst",
                subject.name
            );
        }
        let d = subject
            .store
            .check(Charge::new(&key, &policy, 1))
            .await
            .unwrap();
        assert!(!d.allowed, "{} / {name}: past the burst", subject.name);
    }
    typed_errors(subject).await;
}

/// One policy per algorithm and GCRA constructor, all in whole milliseconds.
pub fn policies(caps: Caps) -> Vec<(&'static str, Policy)> {
    let s = Duration::from_secs;
    let mut all = vec![
        ("cell", Policy::cell(3, 2, s(1)).unwrap()),
        ("funnel", Policy::funnel(4, 2.0).unwrap()),
        ("token_bucket", Policy::token_bucket(5, 4.0).unwrap()),
    ];
    if caps.cell_only {
        all.retain(|(_, p)| p.cell_args().is_some());
    }
    if caps.all_algorithms {
        all.extend([
            ("sliding_log", Policy::sliding_log(4, s(2)).unwrap()),
            ("fixed_window", Policy::fixed_window(4, s(2)).unwrap()),
            ("sliding_window", Policy::sliding_window(4, s(2)).unwrap()),
            (
                "concurrency",
                Policy::concurrency_with_lease(2, s(3)).unwrap(),
            ),
        ]);
    }
    all
}

fn key(subject: &Subject<impl Store>, name: &str, what: &str) -> Vec<u8> {
    format!("{}:{what}:{name}", subject.key_prefix).into_bytes()
}

fn model_now(subject: &Subject<impl Store>) -> u64 {
    let res = subject.caps.resolution.as_nanos() as u64;
    (subject.now_ns)() / res * res
}

/// A tiny deterministic generator, so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Compares a store's decision with the model's.
fn same(subject: &Subject<impl Store>, what: &str, got: &Decision, want: &Decision) {
    let ctx = format!("{} / {what}: store {got:?}, model {want:?}", subject.name);
    assert_eq!(got.allowed, want.allowed, "allowed: {ctx}");
    assert_eq!(got.limit, want.limit, "limit: {ctx}");
    assert_eq!(got.remaining, want.remaining, "remaining: {ctx}");
    assert_eq!(got.retry_after, want.retry_after, "retry_after: {ctx}");
    if subject.caps.exact_reset {
        assert_eq!(got.reset_after, want.reset_after, "reset_after: {ctx}");
        assert_eq!(got.quota_after, want.quota_after, "quota_after: {ctx}");
    } else {
        assert!(got.reset_after >= want.reset_after, "reset_after: {ctx}");
    }
    assert_eq!(got.permit.is_some(), want.permit.is_some(), "permit: {ctx}");
    if subject.caps.refund {
        // The slot the charge was taken from.
        let slot = |d: &Decision| d.receipt().map(|r| (r.units(), r.at_ns(), r.permit()));
        assert_eq!(slot(got), slot(want), "receipt: {ctx}");
    }
}

/// 300 seeded steps: advance, check (or peek), sometimes refund, reset or
/// release; every decision equal to the model's.
async fn model_walk<S: Store>(subject: &Subject<S>, name: &str, policy: &Policy) {
    let key = key(subject, name, "walk");
    let mut model = Model::default();
    let mut rng = Rng(0x853c_49e6_748f_ea9b ^ name.len() as u64);
    let mut held = Vec::new();
    let mut receipts = Vec::new();
    let window_ms = policy.window().as_millis().max(1) as u64;
    for step in 0..300 {
        (subject.advance)(Duration::from_millis(rng.below(window_ms / 2 + 1)));
        let now = model_now(subject);
        let what = format!("{name} step {step}");
        match rng.below(10) {
            // Any charge still held, old or recent, in part or whole: the
            // units go back to its own slot or nowhere.
            0 if subject.caps.refund && !receipts.is_empty() => {
                let i = rng.below(receipts.len() as u64) as usize;
                let receipt: Receipt = receipts.swap_remove(i);
                let receipt = receipt.part(1 + rng.below(2));
                subject
                    .store
                    .refund(&key, policy, &receipt)
                    .await
                    .unwrap_or_else(|e| panic!("{}: refund: {e}", subject.name));
                model.refund(&key, policy, now, &receipt);
            }
            1 if subject.caps.reset && rng.below(3) == 0 => {
                subject
                    .store
                    .reset(&key, policy)
                    .await
                    .unwrap_or_else(|e| panic!("{}: reset: {e}", subject.name));
                model.reset(&key);
                held.clear();
                receipts.clear();
            }
            2 if !held.is_empty() => {
                let permit = held.swap_remove(rng.below(held.len() as u64) as usize);
                subject
                    .store
                    .release(&key, policy, permit)
                    .await
                    .unwrap_or_else(|e| panic!("{}: release: {e}", subject.name));
                model.release(&key, permit.0);
            }
            _ => {
                let cost = if subject.caps.peek {
                    rng.below(3)
                } else {
                    1 + rng.below(2)
                };
                let got = subject
                    .store
                    .check(Charge::new(&key, policy, cost))
                    .await
                    .unwrap_or_else(|e| panic!("{}: {what}: {e}", subject.name));
                let permit = got.permit.map_or(0, |p| p.0);
                let want = model.check(&key, policy, now, cost, permit);
                same(subject, &format!("{what} cost {cost}"), &got, &want);
                if let Some(p) = got.permit {
                    held.push(p);
                }
                receipts.extend(got.receipt());
            }
        }
    }
    for permit in held {
        let _ = subject.store.release(&key, policy, permit).await;
    }
}

/// A key used up and left alone for its window (plus a lease or burst) is
/// fresh again.
async fn expiry<S: Store>(subject: &Subject<S>, name: &str, policy: &Policy) {
    let key = key(subject, name, "expiry");
    let limit = policy.limit();
    for _ in 0..limit + 1 {
        let _ = subject
            .store
            .check(Charge::new(&key, policy, 1))
            .await
            .unwrap();
    }
    let d = subject
        .store
        .check(Charge::new(&key, policy, 1))
        .await
        .unwrap();
    assert!(!d.allowed, "{} / {name}: used up", subject.name);
    (subject.advance)(d.reset_after + policy.window() + Duration::from_secs(1));
    for i in 0..limit {
        let d = subject
            .store
            .check(Charge::new(&key, policy, 1))
            .await
            .unwrap();
        assert!(
            d.allowed,
            "{} / {name}: unit {i} after expiry",
            subject.name
        );
    }
}

/// One rule denying means nothing is charged to the others.
async fn all_or_nothing<S: Store>(subject: &Subject<S>) {
    let open = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    let shut = Policy::cell(0, 1, Duration::from_secs(60)).unwrap();
    let (a, b) = (key(subject, "a", "multi"), key(subject, "b", "multi"));
    let first = subject
        .store
        .check(Charge::new(&b, &shut, 1))
        .await
        .unwrap();
    assert!(first.allowed, "{}: the one unit of b", subject.name);
    for _ in 0..3 {
        let ds = subject
            .store
            .check_all(&[Charge::new(&a, &open, 1), Charge::new(&b, &shut, 1)])
            .await
            .unwrap();
        assert!(ds[0].allowed && !ds[1].allowed, "{}: {ds:?}", subject.name);
        assert_eq!(ds[0].remaining, 10, "{}: a was not charged", subject.name);
    }
    let d = subject.store.check(Charge::new(&a, &open, 0)).await;
    if subject.caps.peek {
        assert_eq!(d.unwrap().remaining, 10, "{}: a untouched", subject.name);
    }
}

/// Permits: distinct ids, the limit holds, a release frees one.
async fn concurrency_permits<S: Store>(subject: &Subject<S>) {
    let policy = Policy::concurrency(3).unwrap();
    let key = key(subject, "permits", "conc");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let d = subject
            .store
            .check(Charge::new(&key, &policy, 1))
            .await
            .unwrap();
        assert!(d.allowed, "{}: a permit", subject.name);
        ids.push(
            d.permit
                .expect("an admitted concurrency check holds a permit"),
        );
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{}: permit ids are distinct", subject.name);
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(!d.allowed, "{}: the limit holds", subject.name);
    subject.store.release(&key, &policy, ids[1]).await.unwrap();
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(d.allowed, "{}: a release frees a permit", subject.name);
    // Releasing twice, or an unknown permit, changes nothing.
    subject.store.release(&key, &policy, ids[1]).await.unwrap();
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(
        !d.allowed,
        "{}: a double release frees nothing",
        subject.name
    );
    for id in ids {
        let _ = subject.store.release(&key, &policy, id).await;
    }
    if let Some(p) = d.permit {
        let _ = subject.store.release(&key, &policy, p).await;
    }
}

/// Bad requests are typed errors, never panics.
async fn typed_errors<S: Store>(subject: &Subject<S>) {
    let policy = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
    let k = key(subject, "dup", "errors");
    if subject.caps.multi_rule {
        let r = subject
            .store
            .check_all(&[Charge::new(&k, &policy, 1), Charge::new(&k, &policy, 1)])
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidRequest(_))),
            "{}: two rules on one key: {r:?}",
            subject.name
        );
    }
    // A cost no policy can ever admit is a denial forever, not an error.
    let d = subject
        .store
        .check(Charge::new(&k, &policy, u64::MAX))
        .await
        .unwrap();
    assert!(d.is_never(), "{}: {d:?}", subject.name);
    if !subject.caps.all_algorithms {
        let log = Policy::sliding_log(1, Duration::from_secs(1)).unwrap();
        let r = subject.store.check(Charge::new(&k, &log, 1)).await;
        assert!(
            matches!(r, Err(StoreError::Unsupported(_))),
            "{}: an unsupported algorithm: {r:?}",
            subject.name
        );
    }
    assert!(matches!(policy.algorithm(), Algorithm::Gcra(_)));
}
