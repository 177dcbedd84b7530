//! Hot descriptors served from the crate's leases (`RLS_LEASES=on`, the
//! default on Redis): a key this process checks often takes a block of
//! units from Redis in one call and spends them in process
//! ([`LeasingStore`]), over the whole store (upstream counters, the
//! crate's Redis store, the memory fallback).
//!
//! # Upstream counters: tickets
//!
//! An upstream-format fixed window is a counter (`INCRBY key hits`; over
//! iff the count after exceeds `requests_per_unit`), and the store never
//! learns the limit. A block of `k` is `INCRBY key k`, upstream's own
//! command: it takes the `k` consecutive counts ("tickets") after the
//! counter's value, and the checks served from it get those counts in
//! order, as their own `INCRBY` would have answered had no other process
//! counted in between. Every count is handed out once, whoever took it (an
//! upstream pod's `INCRBY 1`, this server's block), so at most
//! `requests_per_unit` hits of a window get a count within the limit: no
//! over-admission across any mix of processes, and upstream pods read one
//! correct counter. Rejected hits still take counts, as upstream's do.
//!
//! That needs each served check to learn its exact count, which the
//! lease's `remaining` says only while one block is held: counter leases
//! run without prefetching (a block is asked for when the last one runs
//! out; with 1,024-unit blocks that is one wait per 1,024 checks). A
//! lease's unspent counts go back (a lease short of a large `hits_addend`,
//! a key swept from the lease table, the store dropped) only while they
//! are the counter's last: a small Lua script runs `DECRBY` if the key
//! still holds the count the block left (the block's receipt names it), as
//! if the block had been smaller, so no count is handed out twice and
//! upstream pods read one counter; otherwise they lapse with the window
//! the key names. On the crate's keys (`RLS_REDIS_KEYS=crate`) they always
//! lapse. Counts a process holds are refused to the others: at most 1,024
//! per process and key, and only while it gets no more of that key's
//! checks before its window ends. A peek (`hits_addend: 0`) reads the
//! counter, which includes them.
//!
//! # Other policies
//!
//! The extension algorithms and all-or-nothing checks go through a second
//! [`LeasingStore`] with the crate's defaults, exact by its own guarantee
//! (sliding logs are never leased; GCRA keys lease, the service refunding
//! nothing).
//!
//! # Outages
//!
//! A store error ends every lease; so does the health probe's failing
//! check. Until one happens, a lease in hand still serves the units it
//! holds (charged on Redis before the outage).

use std::future::Future;

use tower_throttle::decision::{DecidedBy, PermitId, Receipt};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Answer, BoxStore, Charge, Decisions, RuleSpec, Store, StoreError};
use tower_throttle::Policy;

use super::{counter_seconds, DynClock};

/// The store with leases: see the module docs.
#[derive(Clone)]
pub struct Leased {
    counters: LeasingStore<Lapsing>,
    others: LeasingStore<BoxStore>,
}

impl Leased {
    /// Leases over `inner`, timed on `clock` (the store's); `tail`: the
    /// counters are upstream's, whose give-backs keep to the tail.
    pub fn new(inner: BoxStore, clock: DynClock, tail: bool) -> Leased {
        let counters = LeasingStore::builder(Lapsing {
            inner: inner.clone(),
            tail,
        })
        .clock(clock.clone())
        .prefetch(false)
        .build();
        let others = LeasingStore::builder(inner).clock(clock).build();
        match (counters, others) {
            (Ok(counters), Ok(others)) => Leased { counters, others },
            // Only the tuning's defaults are set, which are valid.
            _ => unreachable!("the default lease tuning is valid"),
        }
    }

    /// Ends every lease: counts lapse, other units go back.
    pub async fn shutdown(&self) {
        let _ = self.counters.shutdown().await;
        let _ = self.others.shutdown().await;
    }

    /// An unavailable store ends the counter leases too (no I/O: their
    /// counts lapse); the other leases end by themselves on their errors.
    async fn failed(&self, e: StoreError) -> StoreError {
        if e.is_unavailable() {
            let _ = self.counters.flush().await;
        }
        e
    }
}

fn is_counter(policy: &Policy) -> bool {
    counter_seconds(policy).is_some()
}

/// Which store checks a batch of charges.
enum Route {
    /// The counter leases: one counter.
    Counter,
    /// The store under the leases: counters are checked one by one by the
    /// service, so a batch holding one goes to the store as it is.
    Unleased,
    /// Everything else.
    Others,
}

impl Leased {
    fn route(charges: &[Charge<'_>]) -> Route {
        match (charges, charges.iter().any(|c| is_counter(c.policy))) {
            (_, false) => Route::Others,
            ([_], true) => Route::Counter,
            (_, true) => Route::Unleased,
        }
    }

    /// The routed store's answer when it is given at once.
    fn decide_now(&self, charges: &[Charge<'_>]) -> Option<Result<Decisions, StoreError>> {
        match Self::route(charges) {
            Route::Counter => self.counters.decide(charges).ready(),
            Route::Unleased => self.counters.inner().inner.decide(charges).ready(),
            Route::Others => self.others.decide(charges).ready(),
        }
    }

    async fn decide_later(&self, charges: &[Charge<'_>]) -> Result<Decisions, StoreError> {
        match Self::route(charges) {
            Route::Counter => self.counters.decide(charges).await,
            Route::Unleased => self.counters.inner().inner.decide(charges).await,
            Route::Others => self.others.decide(charges).await,
        }
    }
}

impl Store for Leased {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        let ready = match self.decide_now(charges) {
            Some(Ok(decisions)) => return Answer::Now(Ok(decisions)),
            ready => ready,
        };
        Answer::later(async move {
            let result = match ready {
                Some(result) => result,
                None => self.decide_later(charges).await,
            };
            match result {
                Ok(d) => Ok(d),
                Err(e) => Err(self.failed(e).await),
            }
        })
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        if is_counter(policy) {
            self.counters.refund(key, policy, receipt).await
        } else {
            self.others.refund(key, policy, receipt).await
        }
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        if is_counter(policy) {
            self.counters.reset(key, policy).await
        } else {
            self.others.reset(key, policy).await
        }
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.others.release(key, policy, permit).await
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.others.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.others.reserves_slots()
    }
}

/// The store under the counter leases: on the crate's keys, a count given
/// back lapses (see the module docs), unless the memory fallback decided
/// it, which no other process shares.
struct Lapsing {
    inner: BoxStore,
    /// Upstream's counters, which give back at the tail only.
    tail: bool,
}

impl Store for Lapsing {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        self.inner.decide(charges)
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        if !self.tail && is_counter(policy) && receipt.store() == DecidedBy::Primary {
            return Ok(());
        }
        self.inner.refund(key, policy, receipt).await
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        self.inner.validate(rules)
    }

    fn reserves_slots(&self) -> bool {
        self.inner.reserves_slots()
    }
}
