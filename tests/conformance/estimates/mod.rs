//! Estimates that cannot be gamed: a settled rule (`settle_cost`) charges
//! its estimate at admission and the actual cost after the response. Any
//! estimate a client chooses, 0 included, on every algorithm and store
//! (memory, `BoxStore`, `FallbackStore`, leases, Redis on a client clock),
//! with and without `count_if`:
//!
//! - sequential requests on a frozen clock: every counted request but the
//!   last one admitted fits whole, so their actual costs add up to at most
//!   `limit − 1` (the last one needed a unit free), and a request on a spent
//!   quota is refused whatever its estimate;
//! - concurrent requests, all admitted before any settles: their estimates
//!   (at least 1 each) add up to at most the limit.

use std::convert::Infallible;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::{PermitId, Receipt};
use tower_throttle::key::{Global, RequestHead};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::{MemoryStore, Policy, Store, StoreError, ThrottleLayer};

mod by_hand;
mod properties;

const LIMIT: u64 = 10;
const WINDOW: Duration = Duration::from_secs(60);

/// One request: the estimate it asks for (`x-max`), what it costs
/// (`x-used`), and whether it fails (a 500, which `count_if` does not count).
#[derive(Clone, Copy, Debug)]
struct Ask {
    estimate: u64,
    actual: u64,
    fails: bool,
}

fn asks() -> impl Strategy<Value = Vec<Ask>> {
    let estimate =
        prop_oneof![3 => Just(0u64), 1 => Just(1u64), 3 => 0..=LIMIT + 2, 1 => Just(u64::MAX)];
    let actual = prop_oneof![1 => Just(0u64), 4 => 0..=2 * LIMIT, 1 => Just(u64::MAX / 2)];
    let ask =
        (estimate, actual, proptest::bool::weighted(0.2)).prop_map(|(estimate, actual, fails)| {
            Ask {
                estimate,
                actual,
                fails,
            }
        });
    proptest::collection::vec(ask, 1..=30)
}

/// A limit of 10 a minute in each algorithm that counts units.
fn policies() -> Vec<Policy> {
    vec![
        Policy::fixed_window(LIMIT, WINDOW).unwrap(),
        Policy::sliding_window(LIMIT, WINDOW).unwrap(),
        Policy::sliding_log(LIMIT, WINDOW).unwrap(),
        Policy::cell(LIMIT - 1, LIMIT, WINDOW).unwrap(),
    ]
}

/// A store that counts its calls in flight, so a test can wait for the
/// settlement a response starts on a task of its own.
#[derive(Clone)]
struct Quiet<S> {
    inner: S,
    busy: Arc<(AtomicUsize, Notify)>,
}

impl<S> Quiet<S> {
    fn new(inner: S) -> Self {
        Quiet {
            inner,
            busy: Arc::default(),
        }
    }

    /// Returns once no call is in flight (bounded: a hang fails the test).
    async fn settled(&self) {
        let wait = async {
            loop {
                let notified = self.busy.1.notified();
                if self.busy.0.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), wait)
            .await
            .expect("a settlement never finished");
    }

    async fn track<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.busy.0.fetch_add(1, Ordering::SeqCst);
        let out = call.await;
        self.busy.0.fetch_sub(1, Ordering::SeqCst);
        self.busy.1.notify_waiters();
        out
    }
}

impl<S: Store> Store for Quiet<S> {
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
        match self.inner.decide(charges) {
            tower_throttle::store::Answer::Now(answer) => {
                tower_throttle::store::Answer::Now(answer)
            }
            tower_throttle::store::Answer::Later(_) => {
                tower_throttle::store::Answer::Later(async move {
                    self.track(self.inner.decide(charges).into_future()).await
                })
            }
        }
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        self.track(self.inner.refund(key, policy, receipt)).await
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

fn header(req: &RequestHead<'_>, name: &str) -> Option<u64> {
    req.headers().get(name)?.to_str().ok()?.parse().ok()
}

fn request(ask: Ask) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-max", ask.estimate)
        .header("x-used", ask.actual)
        .header("x-fails", if ask.fails { "1" } else { "0" })
        .body(())
        .unwrap()
}

/// Answers after `gate` lets it (one permit each), reporting `x-used`.
fn handler(
    gate: Arc<Semaphore>,
    entered: Arc<AtomicUsize>,
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(move |req: Request<()>| {
        let (gate, entered) = (gate.clone(), entered.clone());
        async move {
            entered.fetch_add(1, Ordering::SeqCst);
            gate.acquire().await.unwrap().forget();
            let used = req.headers()["x-used"].to_str().unwrap().parse().unwrap();
            let mut response = Response::new(Full::new(Bytes::new()));
            if req.headers()["x-fails"] == "1" {
                *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            }
            response.extensions_mut().insert(ReportedCost(used));
            Ok(response)
        }
    })
}

fn layer<S: Store>(store: S, policy: Policy, prefix: &str, count_if: bool) -> ThrottleLayer<S> {
    let layer = ThrottleLayer::new(store, policy)
        .prefix(prefix)
        .key(Global)
        .cost_fn(|req| header(req, "x-max").unwrap_or(0))
        .settle_cost(ActualCost::Reported);
    if count_if {
        layer.count_if(|status| status != StatusCode::INTERNAL_SERVER_ERROR)
    } else {
        layer
    }
}

/// What a request's estimate is charged at admission.
fn charged(ask: &Ask) -> u64 {
    ask.estimate.max(1)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn memory(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

fn leasing<S: Store>(primary: S, clock: &ManualClock) -> LeasingStore<S> {
    LeasingStore::builder(primary)
        .clock(clock.clone())
        .hot_threshold(1)
        .initial_block(4)
        .max_block(4)
        .expiry_margin(Duration::ZERO)
        .build()
        .unwrap()
}

static CASE: AtomicU64 = AtomicU64::new(0);

fn prefix() -> String {
    format!("case{}", CASE.fetch_add(1, Ordering::Relaxed))
}

/// Sequential requests on a frozen clock, each settled before the next.
async fn sequential<S: Store + Clone>(
    store: &Quiet<S>,
    policy: Policy,
    prefix: &str,
    count_if: bool,
    asks: &[Ask],
) -> Result<(), TestCaseError> {
    let gate = Arc::new(Semaphore::new(asks.len()));
    let mut svc =
        layer(store.clone(), policy, prefix, count_if).layer(handler(gate, Arc::default()));
    // The actual costs of the counted requests admitted so far.
    let mut counted: Vec<u64> = Vec::new();
    let mut spent = false;
    for ask in asks {
        let response = svc
            .ready()
            .await
            .unwrap()
            .call(request(*ask))
            .await
            .unwrap();
        let status = response.status();
        response.into_body().collect().await.unwrap();
        store.settled().await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            continue;
        }
        prop_assert!(!spent, "{:?} admitted on a spent quota ({:?})", ask, policy);
        prop_assert!(charged(ask) <= LIMIT, "{:?} admitted above the limit", ask);
        if !(count_if && ask.fails) {
            counted.push(ask.actual);
            let before: u64 = counted[..counted.len() - 1].iter().sum();
            prop_assert!(
                before < LIMIT,
                "{:?} admitted after {} units counted ({:?})",
                ask,
                before,
                policy
            );
            // Room for 1 unit is what every admission needs: a request whose
            // cost filled the quota (or did not fit) leaves it spent.
            spent = before.saturating_add(ask.actual) >= LIMIT;
        }
    }
    Ok(())
}
