//! A store that counts the checks it is asked, per first key, and passes
//! everything to the store it wraps. Only the asynchronous calls are
//! counted: it decides nothing in process, so the layer always takes its
//! future path. Shared through `#[path]`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use tower_throttle::decision::PermitId;
use tower_throttle::{Policy, Store, StoreError};

pub struct CountingStore<S> {
    pub inner: S,
    /// First key of each call → how many calls.
    pub calls: Arc<Mutex<HashMap<Vec<u8>, usize>>>,
    /// Refunds finished, and a wake-up at each: a refund the layer makes
    /// after a response runs on its own task, which a test waits for.
    pub refunds: Arc<(AtomicUsize, Notify)>,
}

impl<S> CountingStore<S> {
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            calls: Arc::default(),
            refunds: Arc::default(),
        }
    }

    /// Checks asked so far, of every key.
    #[allow(dead_code)] // Not every suite reads both counts.
    pub fn checks(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    /// Checks asked so far whose first key ends with `suffix`.
    #[allow(dead_code)]
    pub fn checks_of(&self, suffix: &[u8]) -> usize {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(k, _)| k.ends_with(suffix))
            .map(|(_, n)| n)
            .sum()
    }

    fn count(&self, key: &[u8]) {
        *self.calls.lock().unwrap().entry(key.to_vec()).or_default() += 1;
    }
}

impl<S: Store> Store for CountingStore<S> {
    // A check counts when it is made: at once, or when its future is
    // first polled (one dropped unpolled made none).
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        let first = charges.first().map_or(&b""[..], |r| r.key);
        match self.inner.decide(charges) {
            tower_throttle::store::Answer::Now(answer) => {
                self.count(first);
                tower_throttle::store::Answer::Now(answer)
            }
            tower_throttle::store::Answer::Later(_) => {
                tower_throttle::store::Answer::Later(async move {
                    self.count(first);
                    self.inner.decide(charges).await
                })
            }
        }
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &tower_throttle::decision::Receipt,
    ) -> Result<(), StoreError> {
        let done = self.inner.refund(key, policy, receipt).await;
        self.refunds.0.fetch_add(1, Ordering::SeqCst);
        self.refunds.1.notify_waiters();
        done
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        self.inner.release(key, policy, permit).await
    }
}
