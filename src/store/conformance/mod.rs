//! The store conformance suite: what every [`Store`] must do, checked
//! against slow, obviously-correct reference models ([`model`]). Feature
//! `conformance`.
//!
//! A store author (Postgres, DynamoDB, …) runs it by describing the store
//! as a [`Subject`] (how to move its clock, what it supports) and calling
//! [`run`]: one call, which panics with the store's name and the first
//! difference from the model. Every store of this crate passes it
//! (`tests/conformance/conformance.rs`). The suite covers:
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

// What the suite is given (`subject`), the walk against the model (`walk`)
// and the other checks (`checks`).
mod checks;
mod subject;
mod walk;

use std::time::Duration;

use crate::policy::Policy;
use crate::store::{Charge, Store};

use self::checks::{all_or_nothing, concurrency_permits, expiry, typed_errors};
use self::subject::key;
pub use self::subject::{Caps, Subject};
use self::walk::model_walk;

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
