//! A simple layer answers the common denial straight from the store's
//! decision, without the general path's `RateLimitInfo`. Its 429s must be
//! the general path's, field for field: the same layer made to take the
//! general path (`request_info(true)`) is driven alongside on the same
//! manual clock, and one whose legacy fields keep its 429s off the cached
//! fields, for every algorithm, across window boundaries, with legacy
//! fields, another body format, partition keys and in gRPC.
//!
//! The fast lane asks the store for no admission's figures when nothing
//! reads them: not under a debug subscriber, nor with the `metrics`
//! feature's near-limit count (unless its ratio is 1). Every comparison
//! drives a layer on that lane too, so the ordinary test run holds it to
//! the general path with or without the feature.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::Receipt;
use tower_throttle::grpc::ResponseProtocol;
use tower_throttle::key::Global;
use tower_throttle::response::PartitionKeys;
use tower_throttle::store::{Answer, Charge, Decisions};
use tower_throttle::{MemoryStore, Policy, Store, StoreError, ThrottleLayer};

use crate::warns::Warns;

type Parts = (StatusCode, Vec<(String, Vec<u8>)>, Bytes);

fn ok() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(|_: Request<()>| async { Ok(Response::new(Full::from("ok"))) })
}

/// Sends one request through `svc` (a gRPC one if `grpc`, with an
/// `x-tier` header when `tier` is given) and reads its whole response.
async fn send<S, B>(svc: &S, grpc: bool, tier: Option<&str>) -> Parts
where
    S: Service<Request<()>, Response = Response<B>> + Clone,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut request = Request::new(());
    if let Some(tier) = tier {
        request
            .headers_mut()
            .insert("x-tier", tier.parse().unwrap());
    }
    if grpc {
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            "application/grpc".parse().unwrap(),
        );
    }
    let response = svc.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let fields = response
        .headers()
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, fields, body)
}

/// Three requests every 0.35 s, 120 times, through [`agree_on`].
async fn agree(
    policy: Policy,
    configure: impl Fn(
        ThrottleLayer<MemoryStore<ManualClock>>,
    ) -> ThrottleLayer<MemoryStore<ManualClock>>,
    grpc: bool,
) -> usize {
    agree_on(policy, configure, grpc, &[None; 3], 120).await
}

/// Drives a simple layer and the same layer on the general path with the
/// same requests on one clock: at each of `steps` steps, 0.35 s apart, one
/// request per entry of `tiers` (its `x-tier` header). Returns how many
/// denials they agreed on.
async fn agree_on(
    policy: Policy,
    configure: impl Fn(
        ThrottleLayer<MemoryStore<ManualClock>>,
    ) -> ThrottleLayer<MemoryStore<ManualClock>>,
    grpc: bool,
    tiers: &[Option<&str>],
    steps: usize,
) -> usize {
    // No subscriber on this thread, whatever another test installed
    // globally: `spared` takes the lane without figures.
    let _quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    let clock = ManualClock::new();
    let store = || MemoryStore::builder().clock(clock.clone()).build();
    let simple = configure(ThrottleLayer::new(store(), policy).key(Global)).layer(ok());
    let spared = spare_figures(configure(ThrottleLayer::new(store(), policy).key(Global)));
    let spared = spared.layer(ok());
    let general = configure(ThrottleLayer::new(store(), policy).key(Global))
        .request_info(true)
        .layer(ok());
    // Legacy fields keep a 429 off the cached fields: rendered field by
    // field, the reference for every field but the legacy ones.
    let reference = configure(ThrottleLayer::new(store(), policy).key(Global))
        .request_info(true)
        .legacy_headers(true)
        .layer(ok());
    let without_legacy = |mut parts: Parts| {
        parts
            .1
            .retain(|(name, _)| !name.starts_with("x-ratelimit-"));
        parts
    };
    let mut denials = 0;
    // 0.35 s steps over four windows of the slowest policy: every
    // `Retry-After` from its longest down to 1 s, and boundaries.
    for step in 0..steps {
        for &tier in tiers {
            let a = send(&simple, grpc, tier).await;
            let b = send(&general, grpc, tier).await;
            let c = send(&reference, grpc, tier).await;
            let d = send(&spared, grpc, tier).await;
            assert_eq!(a, b, "{policy:?}, {tier:?} at step {step}");
            assert_eq!(a, d, "{policy:?}, {tier:?} at step {step}");
            assert_eq!(
                without_legacy(a.clone()),
                without_legacy(c),
                "{policy:?}, {tier:?} at step {step}"
            );
            // gRPC's RESOURCE_EXHAUSTED is 8, in an HTTP 200.
            let exhausted = a.1.contains(&("grpc-status".into(), b"8".to_vec()));
            if a.0 == StatusCode::TOO_MANY_REQUESTS || exhausted {
                denials += 1;
            }
        }
        clock.advance(Duration::from_millis(350));
    }
    denials
}

/// `layer` with nothing reading an admission's figures: the near-limit
/// count off where the `metrics` feature has one.
fn spare_figures<S: Store>(layer: ThrottleLayer<S>) -> ThrottleLayer<S> {
    #[cfg(feature = "metrics")]
    return layer.near_limit_ratio(1.0);
    #[cfg(not(feature = "metrics"))]
    layer
}

fn policies() -> [Policy; 5] {
    [
        Policy::cell(2, 1, Duration::from_secs(3)).unwrap(),
        Policy::fixed_window(2, Duration::from_secs(10)).unwrap(),
        Policy::sliding_window(3, Duration::from_secs(10)).unwrap(),
        Policy::sliding_log(3, Duration::from_secs(10)).unwrap(),
        Policy::funnel(2, 0.5).unwrap(),
    ]
}

#[tokio::test]
async fn a_simple_layers_429s_are_the_general_paths() {
    for policy in policies() {
        let denials = agree(policy, |l| l, false).await;
        assert!(denials > 100, "{policy:?}: {denials} denials compared");
    }
}

#[tokio::test]
async fn with_legacy_fields_problem_json_partition_keys_or_grpc_the_429s_are_the_general_paths() {
    for policy in policies() {
        assert!(agree(policy, |l| l.legacy_headers(true), false).await > 100);
        assert!(agree(policy, |l| l.problem_json_body(), false).await > 100);
        let secret = PartitionKeys::with_secret(b"a secret of the test's own");
        let pk = move |l: ThrottleLayer<_>| l.partition_keys(secret.clone());
        assert!(agree(policy, pk, false).await > 100);
        let auto = |l: ThrottleLayer<_>| l.response_protocol(ResponseProtocol::Auto);
        assert!(agree(policy, auto, true).await > 100);
    }
}

/// The request's policy from `x-tier`: the rule's own (absent), the same
/// algorithm with another limit (`premium`), another algorithm (`other`,
/// whose state is kept under a tagged key), or the rule's own policy named
/// explicitly (`same`).
fn tiered(base: Policy) -> impl Fn(&tower_throttle::key::RequestHead<'_>) -> Option<Policy> {
    move |req| match req.headers().get("x-tier")?.as_bytes() {
        b"premium" => Some(Policy::cell(5, 1, Duration::from_secs(3)).unwrap()),
        b"other" => Some(Policy::fixed_window(3, Duration::from_secs(10)).unwrap()),
        b"same" => Some(base),
        _ => None,
    }
}

/// A one-rule layer with a policy per request takes the fast lane too.
/// Every response of such a layer is the general path's, and every 429's
/// fields but the legacy ones the reference's: the rule's own policy
/// (cached fields), another limit, another algorithm (a tagged key), and
/// the rule's own policy picked by the function.
#[tokio::test]
async fn per_request_policies_in_the_fast_lane_answer_as_the_general_path() {
    let base = Policy::cell(2, 1, Duration::from_secs(3)).unwrap();
    let by_fn = |l: ThrottleLayer<MemoryStore<ManualClock>>| l.policy_fn(tiered(base));
    let mut denials = 0;
    for tiers in [
        [None, Some("premium"), Some("other")],
        [Some("same"), None, Some("premium")],
    ] {
        denials += agree_on(base, by_fn, false, &tiers, 80).await;
    }
    assert!(denials > 150, "{denials} denials compared");
}

/// The memory store, noting whether each charge asked for its admission's
/// figures.
struct Noting {
    inner: MemoryStore,
    figures: Arc<Mutex<Vec<bool>>>,
}

impl Store for Noting {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        let mut noted = self.figures.lock().unwrap();
        noted.extend(charges.iter().map(|c| c.figures));
        self.inner.decide(charges)
    }

    fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.refund(key, policy, receipt)
    }

    fn reset(
        &self,
        key: &[u8],
        policy: &Policy,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.reset(key, policy)
    }
}

/// Whether each of 3 requests through a simple layer (configured by
/// `configure`) asked the store for its admission's figures.
async fn figures_asked(
    configure: impl FnOnce(ThrottleLayer<Noting>) -> ThrottleLayer<Noting>,
) -> Vec<bool> {
    let figures = Arc::new(Mutex::new(Vec::new()));
    let store = Noting {
        inner: MemoryStore::new(),
        figures: figures.clone(),
    };
    let policy = Policy::cell(10, 1, Duration::from_secs(1)).unwrap();
    let svc = configure(ThrottleLayer::new(store, policy).key(Global)).layer(ok());
    for _ in 0..3 {
        assert_eq!(send(&svc, false, None).await.0, StatusCode::OK);
    }
    let asked = figures.lock().unwrap().clone();
    asked
}

/// The lane the comparisons above rely on is the one taken: no figures
/// while nothing reads them, figures for the near-limit count and under a
/// debug subscriber.
#[tokio::test]
async fn a_simple_layer_asks_for_figures_only_when_something_reads_them() {
    // This thread's own subscribers: a test of this binary may have
    // installed a global one that listens at every level.
    let quiet = tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::default());
    assert_eq!(figures_asked(spare_figures).await, [false; 3]);
    let default = figures_asked(|l| l).await;
    assert_eq!(default, [cfg!(feature = "metrics"); 3], "near-limit count");
    drop(quiet);
    let listening = tracing::subscriber::set_default(Warns(Arc::default()));
    assert_eq!(figures_asked(spare_figures).await, [true; 3], "debug");
    drop(listening);
}
