//! The fallback store over a primary that can be taken down or made to
//! hang: which store decides when (`switching`), and where permits,
//! refunds and resets land (`charges`).

use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::decision::{DecidedBy, Decision, PermitId};
use crate::policy::Policy;
use crate::store::{budget, Answer, AtOnce, Charge, Decisions, StoreError};

const DOWN: u8 = 1;
const HANG: u8 = 2;

/// A memory store that can be taken down (connection refused) or made to
/// hang, counting the calls that reach it. Never decides synchronously, as
/// a remote store.
#[derive(Clone)]
struct Flaky {
    inner: MemoryStore<ManualClock>,
    state: Arc<AtomicU8>,
    calls: Arc<AtomicUsize>,
}

impl Flaky {
    fn new(clock: &ManualClock) -> Self {
        Flaky {
            inner: MemoryStore::builder().clock(clock.clone()).build(),
            state: Arc::default(),
            calls: Arc::default(),
        }
    }

    fn set(&self, state: u8) {
        self.state.store(state, Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    async fn gate(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.state.load(Ordering::SeqCst) {
            DOWN => Err(StoreError::Connection("connection refused".into())),
            HANG => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

impl Store for Flaky {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        Answer::Later(async move {
            self.gate().await?;
            self.inner.decide(charges).await
        })
    }
    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.refund(key, policy, receipt).await
    }
    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.reset(key, policy).await
    }
    async fn release(&self, key: &[u8], policy: &Policy, p: PermitId) -> Result<(), StoreError> {
        self.gate().await?;
        self.inner.release(key, policy, p).await
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

fn setup() -> (
    ManualClock,
    Flaky,
    FallbackStore<Flaky, MemoryStore<ManualClock>>,
) {
    let clock = ManualClock::new();
    let primary = Flaky::new(&clock);
    let fallback = MemoryStore::builder().clock(clock.clone()).build();
    let store = FallbackStore::new(primary.clone(), fallback).clock(clock.clone());
    (clock, primary, store)
}

fn window(n: u64) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(3600)).unwrap()
}

async fn futures<S: Store>(store: &S, rule: Charge<'_>, n: usize) -> Vec<Decision> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(store.check(rule).await.unwrap());
    }
    out
}

mod charges;
mod switching;
