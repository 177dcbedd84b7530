//! Configuring a [`LeasingStore`].

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::table::{Table, Tuning};
use super::{LeasingShared, LeasingStore};
use crate::clock::{Clock, SystemClock};
use crate::store::Store;

/// Default [`LeasingStoreBuilder::hot_threshold`]: local checks per period.
pub const DEFAULT_HOT_THRESHOLD: u64 = 64;
/// Default [`LeasingStoreBuilder::initial_block`].
pub const DEFAULT_INITIAL_BLOCK: u64 = 8;
/// Default [`LeasingStoreBuilder::max_block`].
pub const DEFAULT_MAX_BLOCK: u64 = 1024;
/// Default [`LeasingStoreBuilder::blocks_per_period`].
pub const DEFAULT_BLOCKS_PER_PERIOD: u64 = 8;
/// Default [`LeasingStoreBuilder::expiry_margin`].
pub const DEFAULT_EXPIRY_MARGIN: Duration = Duration::from_millis(1);
/// Default [`LeasingStoreBuilder::max_tracked_keys`].
pub const DEFAULT_MAX_TRACKED_KEYS: usize = 10_000;

/// Why a [`LeasingStoreBuilder`] could not build.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseConfigError {
    /// A setting that must be at least 1 was 0 (its name).
    Zero(&'static str),
    /// The initial block is larger than the largest block allowed.
    InitialAboveMax {
        /// The initial block size given.
        initial: u64,
        /// The largest block size given.
        max: u64,
    },
}

impl fmt::Display for LeaseConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseConfigError::Zero(what) => write!(f, "{what} must be at least 1"),
            LeaseConfigError::InitialAboveMax { initial, max } => {
                write!(f, "initial block {initial} is above the max block {max}")
            }
        }
    }
}

impl std::error::Error for LeaseConfigError {}

/// Builds a [`LeasingStore`]; see [`LeasingStore::builder`].
#[must_use = "builders do nothing until built"]
pub struct LeasingStoreBuilder<S> {
    inner: S,
    clock: Box<dyn Clock>,
    tuning: Tuning,
}

impl<S> fmt::Debug for LeasingStoreBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasingStoreBuilder")
            .field("tuning", &self.tuning)
            .finish_non_exhaustive()
    }
}

impl<S: Store> LeasingStoreBuilder<S> {
    pub(super) fn new(inner: S) -> Self {
        LeasingStoreBuilder {
            inner,
            clock: Box::new(SystemClock::new()),
            tuning: Tuning {
                hot_threshold: DEFAULT_HOT_THRESHOLD,
                initial_block: DEFAULT_INITIAL_BLOCK,
                max_block: DEFAULT_MAX_BLOCK,
                blocks_per_period: DEFAULT_BLOCKS_PER_PERIOD,
                max_keys: DEFAULT_MAX_TRACKED_KEYS,
                lease_gcra: true,
                margin_ns: 1_000_000,
                prefetch: true,
            },
        }
    }

    /// The local clock that times leases (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests). It must run at
    /// the inner store's rate; its origin may differ (see the module docs,
    /// *Clocks*).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// Local checks per period (τ for GCRA, the window for windows) from
    /// which a key leases (default [`DEFAULT_HOT_THRESHOLD`]). Keys below
    /// it cost what they cost without leasing: one inner call per check.
    pub fn hot_threshold(mut self, checks_per_period: u64) -> Self {
        self.tuning.hot_threshold = checks_per_period;
        self
    }

    /// Size of a key's first block (default [`DEFAULT_INITIAL_BLOCK`]).
    pub fn initial_block(mut self, units: u64) -> Self {
        self.tuning.initial_block = units;
        self
    }

    /// The largest block (default [`DEFAULT_MAX_BLOCK`]): the most units
    /// one process holds of one key, which bounds the unfairness between
    /// processes.
    pub fn max_block(mut self, units: u64) -> Self {
        self.tuning.max_block = units;
        self
    }

    /// Blocks a key at its current local rate would take per period
    /// (default [`DEFAULT_BLOCKS_PER_PERIOD`]): a block is at most the
    /// local rate divided by this, so a larger value means smaller blocks,
    /// more inner calls and fairer sharing.
    pub fn blocks_per_period(mut self, blocks: u64) -> Self {
        self.tuning.blocks_per_period = blocks;
        self
    }

    /// Keys whose rate is tracked (default [`DEFAULT_MAX_TRACKED_KEYS`]):
    /// when full, keys idle for two periods are dropped, and new keys are
    /// treated as cold until there is room.
    pub fn max_tracked_keys(mut self, keys: usize) -> Self {
        self.tuning.max_keys = keys;
        self
    }

    /// Whether GCRA keys lease (default `true`). Turn it off for a store
    /// whose GCRA charges are refunded (`count_if`, settled costs, waiters
    /// that leave): a refund frees the tail of a GCRA queue, which may hold
    /// another process's lease (see the module docs, *Why GCRA units are
    /// not given back*). Windows lease either way.
    pub fn lease_gcra(mut self, lease: bool) -> Self {
        self.tuning.lease_gcra = lease;
        self
    }

    /// Whether a key's next block is asked for in the background when its
    /// lease is down to a quarter of its block (default `true`), so that
    /// its checks do not wait a round trip for each block. A process then
    /// holds up to a block and a quarter of a key (see the module docs,
    /// *Block size and fairness*). The block is taken on a task of the
    /// Tokio runtime the check runs on; a check outside any runtime leaves
    /// the next block to be asked for when the lease runs out.
    pub fn prefetch(mut self, prefetch: bool) -> Self {
        self.tuning.prefetch = prefetch;
        self
    }

    /// How much earlier than its slot's end a leased unit expires (default
    /// [`DEFAULT_EXPIRY_MARGIN`]): it absorbs the store's clock granularity
    /// (the Redis stores decide in whole microseconds) and any difference in
    /// rate between the local clock and the store's over one slot. Zero is
    /// exact for a store on the same clock (tests with a manual clock).
    pub fn expiry_margin(mut self, margin: Duration) -> Self {
        self.tuning.margin_ns = u64::try_from(margin.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// The store, or the setting that cannot work.
    pub fn build(self) -> Result<LeasingStore<S>, LeaseConfigError> {
        let t = self.tuning;
        for (value, name) in [
            (t.hot_threshold, "hot_threshold"),
            (t.initial_block, "initial_block"),
            (t.max_block, "max_block"),
            (t.blocks_per_period, "blocks_per_period"),
            (t.max_keys as u64, "max_tracked_keys"),
        ] {
            if value == 0 {
                return Err(LeaseConfigError::Zero(name));
            }
        }
        if t.initial_block > t.max_block {
            return Err(LeaseConfigError::InitialAboveMax {
                initial: t.initial_block,
                max: t.max_block,
            });
        }
        Ok(LeasingStore {
            shared: Arc::new(LeasingShared {
                inner: Arc::new(self.inner),
                clock: self.clock,
                tuning: t,
                table: Mutex::new(Table::default()),
                closed: std::sync::atomic::AtomicBool::new(false),
                block_landed: tokio::sync::Notify::new(),
                prefetching: std::sync::atomic::AtomicUsize::new(0),
            }),
        })
    }
}
