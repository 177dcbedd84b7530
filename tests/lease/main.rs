//! Leases ([`LeasingStore`](tower_throttle::store::lease::LeasingStore)):
//! schedules of several leasing processes over one shared store, never
//! above the limit, and the seams with the rest of the crate.
//!
//! One test binary for the area (`cargo test --test lease`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[path = "../support/counting_store.rs"]
mod counting_store;
#[path = "../support/peek.rs"]
mod peek;

mod answers;
mod conforming;
mod layer;
mod seams;
