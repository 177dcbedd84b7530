//! The hottest keys of a memory store: which keys took the most checks and
//! the most denials over a recent interval, in bounded memory.
//!
//! Off by default ([`MemoryStoreBuilder::track_hottest_keys`]). The
//! summaries are the ones every store's hottest keys are counted with
//! ([`crate::store::hottest`]); the memory store keeps its own so that its
//! in-process checks are counted where they are decided, sampled one in
//! `sample_every` per thread, which keeps the store's hot path off the
//! summary's lock most of the time.
//!
//! [`MemoryStoreBuilder::track_hottest_keys`]: super::MemoryStoreBuilder::track_hottest_keys

pub use crate::store::hottest::{HottestKeys, KeyActivity};
pub(super) use crate::store::hottest::{Tracker, Tracking};
