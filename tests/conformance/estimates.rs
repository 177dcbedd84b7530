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

use crate::redis_support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use redis_support::{current_thread_runtime, RedisServer};
use tokio::sync::{Notify, Semaphore};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::{PermitId, Receipt};
use tower_throttle::key::{Global, RequestHead};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{BoxStore, Charge, FallbackStore};
use tower_throttle::{Decision, MemoryStore, Policy, Store, StoreError, ThrottleLayer};

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
    async fn check(&self, rule: Charge<'_>) -> Result<Decision, StoreError> {
        self.track(self.inner.check(rule)).await
    }

    async fn check_all(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.track(self.inner.check_all(rules)).await
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

/// Requests all admitted before any answers: the estimates they were
/// charged add up to at most the limit.
async fn concurrent<S: Store + Clone>(
    store: &Quiet<S>,
    policy: Policy,
    prefix: &str,
    count_if: bool,
    asks: &[Ask],
) -> Result<(), TestCaseError> {
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let svc = layer(store.clone(), policy, prefix, count_if)
        .layer(handler(gate.clone(), entered.clone()));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for ask in asks {
        let mut svc = svc.clone();
        let refused = refused.clone();
        let ask = *ask;
        calls.push(tokio::spawn(async move {
            let response = svc.ready().await.unwrap().call(request(ask)).await.unwrap();
            let status = response.status();
            if status == StatusCode::TOO_MANY_REQUESTS {
                refused.fetch_add(1, Ordering::SeqCst);
            }
            response.into_body().collect().await.unwrap();
            (ask, status)
        }));
    }
    let all_in = async {
        while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < asks.len() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all_in)
        .await
        .expect("requests never arrived");
    let admitted = entered.load(Ordering::SeqCst);
    gate.add_permits(admitted);
    let mut charged_sum = 0u64;
    for call in calls {
        let (ask, status) = call.await.unwrap();
        if status != StatusCode::TOO_MANY_REQUESTS {
            charged_sum = charged_sum.saturating_add(charged(&ask));
        }
    }
    store.settled().await;
    prop_assert!(
        charged_sum <= LIMIT,
        "{} estimate units admitted at once ({:?})",
        charged_sum,
        policy
    );
    Ok(())
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

/// Runs both properties on the in-process stores: each case on a fresh
/// store of each kind.
#[test]
fn in_process_stores_refuse_a_spent_quota_whatever_the_estimate() {
    let rt = current_thread_runtime();
    for policy in policies() {
        proptest!(config(48), |(asks in asks(), count_if in any::<bool>())| {
            rt.block_on(async {
                let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
                let stores: Vec<(&str, BoxStore)> = vec![
                    ("memory", BoxStore::new(memory(&clock))),
                    ("fallback", BoxStore::new(FallbackStore::new(memory(&clock), memory(&clock)))),
                    ("lease", BoxStore::new(leasing(memory(&clock), &clock))),
                ];
                for (name, store) in stores {
                    let store = Quiet::new(store);
                    let named = |e: TestCaseError| TestCaseError::fail(format!("{name}: {e}"));
                    sequential(&store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                    concurrent(&store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                }
                Ok::<(), TestCaseError>(())
            })?;
        });
    }
}

/// The same on a real Redis server (client clock, frozen), directly and
/// through leases.
#[test]
fn redis_refuses_a_spent_quota_whatever_the_estimate() {
    let server = RedisServer::start();
    let rt = current_thread_runtime();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let redis = rt.block_on(async {
        RedisStore::builder()
            .prefix("estimates")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap()
    });
    let direct = Quiet::new(BoxStore::new(redis.clone()));
    let leased = Quiet::new(BoxStore::new(leasing(redis, &clock)));
    for policy in policies() {
        proptest!(config(16), |(asks in asks(), count_if in any::<bool>())| {
            rt.block_on(async {
                for (name, store) in [("redis", &direct), ("lease", &leased)] {
                    let named = |e: TestCaseError| TestCaseError::fail(format!("{name}: {e}"));
                    sequential(store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                    concurrent(store, policy, &prefix(), count_if, &asks).await.map_err(named)?;
                }
                Ok::<(), TestCaseError>(())
            })?;
        });
    }
}

/// The attack of the issue, by hand: an estimate of 0 on a quota of 10
/// units whose requests each cost 5. Only 2 requests get through, then
/// every one is refused until the window turns.
#[tokio::test]
async fn an_estimate_of_zero_is_refused_on_a_spent_quota() {
    for policy in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = Quiet::new(memory(&clock));
        let gate = Arc::new(Semaphore::new(100));
        let mut svc =
            layer(store.clone(), policy, "attack", false).layer(handler(gate, Arc::default()));
        let mut admitted = 0;
        for _ in 0..20 {
            let ask = Ask {
                estimate: 0,
                actual: 5,
                fails: false,
            };
            let response = svc.ready().await.unwrap().call(request(ask)).await.unwrap();
            admitted += usize::from(response.status() == StatusCode::OK);
            response.into_body().collect().await.unwrap();
            store.settled().await;
        }
        assert_eq!(admitted, 2, "{policy:?}: 2 × 5 units fill a quota of 10");
    }
}

/// The case the property found: GCRA leases over memory, a prefetched
/// block landing between the overage's two charges (the room shrank): the
/// overage looks again instead of dropping every unit.
#[test]
fn an_overage_looks_again_when_the_room_shrinks_meanwhile() {
    let rt = current_thread_runtime();
    let ask = |estimate, actual| Ask {
        estimate,
        actual,
        fails: false,
    };
    let asks = [ask(0, 2), ask(0, 8), ask(0, 0)];
    let policy = Policy::cell(LIMIT - 1, LIMIT, WINDOW).unwrap();
    rt.block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = Quiet::new(BoxStore::new(leasing(memory(&clock), &clock)));
        sequential(&store, policy, &prefix(), false, &asks).await
    })
    .unwrap();
}
