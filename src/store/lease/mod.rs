//! Hot keys at in-process speed on a shared store, never above the limit:
//! [`LeasingStore`].
//!
//! A [`LeasingStore`] wraps a shared store (Redis, say). A key this process
//! checks often (a `Global` rule, a popular tenant) takes a **block** of `k`
//! units from the inner store in one call — `inner.check` of a charge of
//! cost `k`, charged there like any admission, with that decision's
//! [`Receipt`](crate::decision::Receipt) — and spends the units in process,
//! one check at a time, with no store call. A block that is denied falls
//! back to an ordinary check of the request's own cost (the room may be
//! smaller than the block, not zero).
//!
//! # The guarantee
//!
//! Leased units are charged on the shared store before they are spent, so
//! across every process the store never admits more than the limit. What a
//! lease must add is that each unit is spent **inside the slot it was
//! charged in**; the lease enforces it per algorithm:
//!
//! * **Fixed window.** A block charged in window `i` counts in window `i`
//!   (or in a later window the key already holds — another process's clock
//!   ran ahead, or its call arrived first — which its receipt then names);
//!   its units may be spent until that window ends (`reset_after` of the
//!   block's decision is exactly the time left in it). The units spent in a
//!   window are at most the units charged in it, so at most `max`.
//! * **Sliding window.** The same: the block counts in the current count of
//!   window `i` (weight 1, like an admission at any instant of `i`), and its
//!   units expire when window `i` ends (`reset_after − window`). At each
//!   spend, the estimate over the units really spent is at most the store's
//!   estimate, which every admission kept within `max` and which never rises
//!   without one.
//! * **GCRA.** A block of `k` charged at `t0` on a state whose theoretical
//!   arrival time is `x` moves it to `b + k·T`, where `b = max(t0, x)` (the decision's
//!   `reset_after` is `b + k·T − t0`). Unit `i` gets the virtual slot
//!   `s_i = b + i·T` and may be spent only at instants `u ≤ s_i`; a unit
//!   whose slot has passed expires.
//!
//!   *Proof that the spends conform.* A sequence of unit admissions at
//!   sorted instants `u_1 ≤ … ≤ u_n` is GCRA-conforming iff every interval
//!   `[a, b]` holds at most `(b − a + τ) / T` of them (unroll
//!   `TAT_n = max(TAT_{n−1}, u_n) + T`: unit `n` passes iff
//!   `u_m + (n − m + 1)·T ≤ u_n + τ` for every `m ≤ n`). Without refunds, the
//!   store lays every charge's units on disjoint slots `[s, s + T)` (each
//!   charge starts at or after the previous arrival time), and its admission test
//!   `b + k·T ≤ t0 + τ` gives every unit `s + T − τ ≤ t0 ≤ u`. With `u ≤ s`,
//!   the units spent in `[a, b]` have slots in `[a, b + τ − T]`, whose
//!   disjoint intervals fit in `[a, b + τ)`: at most `(b − a + τ) / T` of
//!   them. Ordinary admissions are the case `u = t0 = s`.
//!   `tests/lease/conforming.rs` checks it on schedules of several leasing
//!   stores over one shared store, with [`crate::algorithm::gcra`] replaying
//!   the admissions.
//!
//! ## Why GCRA units are not given back
//!
//! A GCRA state is one number, so a refund frees the **tail** of the queue
//! of slots, which may be another process's lease: with `T` = 1 s and a
//! limit of 4, at t = 0 process A takes 2 ordinary units (arrival time 2),
//! B leases 2 (slots 2 and 3), A's units are refunded (arrival time 2), C leases 2
//! (slots 2 and 3 again); at t = 2 D takes 2, and B and C spend theirs at
//! 2 and 3: six admissions in `[2 s, 3 s]` where GCRA allows five. So a
//! GCRA lease's unspent units are never refunded to the inner store (they
//! lapse with their slots, within `k·T`), and **the GCRA guarantee holds for
//! keys whose charges are not refunded while leases of them are out**: a
//! rule with `count_if` or settled costs on a GCRA policy should keep GCRA
//! leasing off ([`LeasingStoreBuilder::lease_gcra`]). Window counts have no
//! order, so their refunds are exact with leases too.
//!
//! ## What is never leased
//!
//! * **Sliding logs**: the log records each admission at its instant and
//!   forgets it one window later. A block charged at `t0` is recorded at
//!   `t0` and leaves the log at `t0 + w`, but a unit spent at `u > t0` must
//!   count until `u + w`: in `[t0 + w, u + w)` the store would admit another
//!   unit in its place while it is still in that unit's window.
//! * **Concurrency**: a permit is one request's, held while it runs and
//!   released when it ends, and no time bounds when a unit comes back: a
//!   lease would only strand in-flight capacity in one process (and each
//!   release still needs the store).
//! * **Lock-outs** ([`Charge::penalty`](crate::store::Charge::penalty)),
//!   peeks (cost 0), GCRA charges of more than one unit, GCRA
//!   reservations (delay mode and `Limiter::wait` check a policy whose
//!   tolerance is stretched to admit a slot ahead), and GCRA altogether
//!   over a store that does not run GCRA as this crate defines
//!   it ([`Store::reserves_slots`] false: `CellStore`'s whole-second
//!   replies, governor).
//!
//! # Refunds and shutdown
//!
//! Unspent window units go back through the block's receipt
//! (`refund(key, policy, &receipt.part(unspent))`, into the window they
//! were charged in) when a lease is replaced or the key is swept, on
//! [`LeasingStore::flush`] and [`LeasingStore::shutdown`], and when the last
//! clone is dropped (on a task of the current Tokio runtime, if any). A
//! refund of a check served from a lease puts its unit back into that lease
//! while its slot lasts — never into another slot; a window lease that has
//! ended sends a sliding window's units on to the inner store (they still
//! weigh in the next window), and anything else goes to the inner store as
//! it is. [`Store::reset`] forgets the local lease and resets the inner store.
//!
//! # Block size and fairness
//!
//! Each key's local rate is its checks in the current and previous period
//! (τ for GCRA, the window for windows), in a table of at most
//! [`LeasingStoreBuilder::max_tracked_keys`] keys. A key below
//! [`LeasingStoreBuilder::hot_threshold`] checks per period never leases:
//! a cold key costs one inner call per check, as without this store. A hot
//! key's block is its adaptive size — doubled after a lease spent in full,
//! halved after one whose units expired unspent — capped by
//! [`LeasingStoreBuilder::max_block`], by the local rate divided by
//! [`LeasingStoreBuilder::blocks_per_period`], by the limit, and by the
//! shared `remaining` last seen plus the check's cost.
//!
//! **Prefetching** ([`LeasingStoreBuilder::prefetch`], on by default):
//! when a check leaves a lease with a quarter of its block or less (at
//! least one unit), the key's next block is asked for in the background,
//! on the current Tokio runtime, and kept as the key's next lease, spent
//! once the lease in hand can serve no more. Checks then wait for a block
//! only when a lease runs out before the next one lands. Each block is a
//! lease of its own (charged, spent inside its slot, given back through
//! its receipt), so the guarantee above holds for each.
//!
//! What degrades is **fairness** between processes, never the limit: a
//! process holding units can admit while another is denied, until the
//! window ends (windows) or the units' slots pass (GCRA). The bound: each
//! process holds at most a lease of a key down to a quarter of its block
//! and the next block, `held = max_block + max(1, max_block / 4)` units
//! (`max_block` without prefetching; refunds of served checks put back
//! into the lease that served them can raise it by the units refunded), so
//! a window's count is its admissions plus at most `processes × held` units
//! held, and a check is denied only once the window has admitted at least
//! `limit − processes × held` (`tests/redis/redis_lease.rs` measures it on
//! a real Redis). A GCRA lease pays only where one process spends about as
//! fast as the key's rate (`1/T`) or the key has a backlog: units spent
//! slower than their slots lapse, and the block shrinks.
//!
//! # Decisions served from a lease
//!
//! `allowed`, `limit` and `charged` are exact. `remaining` is an
//! **estimate**: the shared remaining at the latest block (a prefetched
//! one, once it has landed) plus the units this process still holds (other
//! processes' admissions since are not seen).
//! `reset_after` and `quota_after` are the block's, less the time since.
//! The receipt names the block's window (windows) or the unit's slot on the
//! inner store's clock (GCRA).
//!
//! # Composition
//!
//! * **All-or-nothing checks**: a rule served from a lease takes its units
//!   locally first, the others (a block for a hot key without a lease, as
//!   one charge of the block's size) go to one inner `check_all`; when the
//!   combined answer denies, the local units go back into their lease.
//! * **[`FallbackStore`](crate::store::FallbackStore)**: a lease ends when
//!   the store fails: an inner error that says the store is unavailable
//!   ([`StoreError::is_unavailable`]), or a decision made by the fallback,
//!   drops every lease (nothing is given back to a failing store). A block
//!   the fallback decided is not leased: its units beyond the check's cost
//!   go back at once.
//!
//! # Clocks
//!
//! Leases are timed on the local clock, read before the block is asked for:
//! a deadline is that reading plus the time left in the slot at the store's
//! decision, which is no later than the slot's end however long the call
//! took, less [`LeasingStoreBuilder::expiry_margin`] (1 ms by default: the
//! store's clock granularity, whole microseconds on Redis, and rate skew).
//! The local clock must run at the store's rate; its origin may differ. The
//! check that asks for a block is admitted by the block's own decision, at
//! its charge, like any admission.

mod builder;
mod calls;
mod grant;
mod plan;
mod store_impl;
mod table;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

pub use builder::{
    LeaseConfigError, LeasingStoreBuilder, DEFAULT_BLOCKS_PER_PERIOD, DEFAULT_EXPIRY_MARGIN,
    DEFAULT_HOT_THRESHOLD, DEFAULT_INITIAL_BLOCK, DEFAULT_MAX_BLOCK, DEFAULT_MAX_TRACKED_KEYS,
};

use self::table::{GiveBack, Table, Tuning};
use crate::clock::Clock;
use crate::store::{Store, StoreError};

/// A store that leases blocks of units of hot keys from `S` and spends them
/// in process. See the [module docs](self).
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_throttle::store::lease::LeasingStore;
/// use tower_throttle::{Limiter, MemoryStore, Policy};
///
/// // In production the inner store is shared (a RedisStore).
/// let store = LeasingStore::builder(MemoryStore::new())
///     .hot_threshold(100)
///     .max_block(256)
///     .build()?;
/// let api = Limiter::new(store.clone(), Policy::fixed_window(50_000, Duration::from_secs(1))?);
/// assert!(api.check("global").await?.allowed);
/// store.shutdown().await?; // unspent window units go back
/// # Ok(())
/// # }
/// ```
///
/// Clones share the leases.
pub struct LeasingStore<S: Store> {
    shared: Arc<LeasingShared<S>>,
}

impl<S: Store> Clone for LeasingStore<S> {
    fn clone(&self) -> Self {
        LeasingStore {
            shared: self.shared.clone(),
        }
    }
}

impl<S: Store> std::fmt::Debug for LeasingStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasingStore")
            .field("tuning", &self.shared.tuning)
            .finish_non_exhaustive()
    }
}

/// What clones share.
struct LeasingShared<S: Store> {
    inner: Arc<S>,
    clock: Box<dyn Clock>,
    tuning: Tuning,
    table: Mutex<Table>,
    /// After [`LeasingStore::shutdown`]: no new leases.
    closed: AtomicBool,
    /// Woken whenever a block is no longer in flight (kept, denied, failed
    /// or dropped): checks of its key wait for it instead of each asking
    /// the inner store while it is on its way.
    block_landed: tokio::sync::Notify,
    /// Prefetches in flight (their tasks alive): `shutdown` waits for them.
    prefetching: std::sync::atomic::AtomicUsize,
}

impl<S: Store> LeasingStore<S> {
    /// A leasing store over `inner` with the default tuning.
    pub fn new(inner: S) -> Self {
        LeasingStoreBuilder::new(inner)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// Configures a leasing store over `inner`.
    pub fn builder(inner: S) -> LeasingStoreBuilder<S> {
        LeasingStoreBuilder::new(inner)
    }

    /// The inner (shared) store.
    pub fn inner(&self) -> &S {
        &self.shared.inner
    }

    /// Units of `key` this process holds and may still spend now (its
    /// lease and the next block, if prefetched).
    pub fn local_units(&self, key: &[u8]) -> u64 {
        let now = self.shared.clock.now_ns();
        let mut table = self.shared.lock();
        table.get_mut(key).map_or(0, |s| {
            [s.lease.as_mut(), s.next.as_mut()]
                .into_iter()
                .flatten()
                .map(|l| l.unspent(now))
                .sum()
        })
    }

    /// The size the next block of `key` would have before the caps of the
    /// moment (rate, remaining): what adapts. `None` if untracked.
    pub fn block_target(&self, key: &[u8]) -> Option<u64> {
        self.shared.lock().get_mut(key).map(|s| s.block())
    }

    /// Ends every lease and gives the unspent units of window leases back
    /// to the inner store, each into the window it was charged in (GCRA
    /// units lapse instead: see the module docs). Returns the units given
    /// back; on errors, every refund is still tried and the first error is
    /// returned. Leasing goes on afterwards.
    pub async fn flush(&self) -> Result<u64, StoreError> {
        let now = self.shared.clock.now_ns();
        let mut give_back = Vec::new();
        self.shared.lock().end_all(now, &mut give_back);
        give_back_all(&*self.shared.inner, give_back).await
    }

    /// [`LeasingStore::flush`], and no new leases from then on (every check
    /// goes to the inner store): call it before the process exits. Blocks
    /// prefetched in the background and still on their way are waited for:
    /// each goes back by itself when it lands (and is not counted in the
    /// units returned).
    pub async fn shutdown(&self) -> Result<u64, StoreError> {
        self.shared.closed.store(true, Ordering::SeqCst);
        let returned = self.flush().await;
        loop {
            let landed = self.shared.block_landed.notified();
            let mut landed = std::pin::pin!(landed);
            // Registered before looking: a landing in between still wakes.
            landed.as_mut().enable();
            if self.shared.prefetching.load(Ordering::SeqCst) == 0 {
                return returned;
            }
            landed.await;
        }
    }
}

impl<S: Store> LeasingShared<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic elsewhere leaves the table consistent (no invariant spans
        // a panic point), so a poisoned lock is still usable.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Refunds every receipt; the units given back, or the first error.
async fn give_back_all<S: Store>(inner: &S, give_back: Vec<GiveBack>) -> Result<u64, StoreError> {
    let mut units = 0;
    let mut first_error = None;
    for (key, policy, receipt) in give_back {
        match inner.refund(&key, &policy, &receipt).await {
            Ok(()) => units += receipt.units(),
            Err(error) => {
                tracing::warn!(target: "tower_throttle", %error,
                    "could not give leased units back to the shared store");
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(units), Err)
}

impl<S: Store> Drop for LeasingShared<S> {
    fn drop(&mut self) {
        let now = self.clock.now_ns();
        let mut give_back = Vec::new();
        self.table
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .end_all(now, &mut give_back);
        if give_back.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let inner = self.inner.clone();
                runtime.spawn(async move {
                    let _ = give_back_all(&*inner, give_back).await;
                });
            }
            Err(_) => tracing::warn!(target: "tower_throttle",
                "a LeasingStore dropped outside a Tokio runtime could not give its \
                 unspent units back; call shutdown() first"),
        }
    }
}

#[cfg(test)]
mod tests;
