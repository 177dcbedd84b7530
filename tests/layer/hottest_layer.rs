//! The hottest keys of a layer whose decisions Redis makes: counted where
//! the layer's store decides (`store::Hottest`), not in a memory store
//! that never sees them, and across a fallback period; each count read as
//! exact or with its bounds, against a real redis-server.

use crate::redis_support::{current_thread_runtime, RedisServer};

use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::HeaderKey;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::{FallbackStore, Hottest};
use tower_throttle::{MemoryStore, Policy, Store, ThrottleLayer};

const MIN: Duration = Duration::from_secs(60);

async fn redis(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("hot")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .connect(server.url().as_str())
        .await
        .unwrap()
}

/// A layer of 10 requests a minute per `x-user`, and a way to send as one.
fn service<S: Store>(
    store: Hottest<S, ManualClock>,
) -> (
    ThrottleLayer<Hottest<S, ManualClock>>,
    impl Service<Request<()>, Response = Response<impl Sized>, Error = impl std::fmt::Debug> + Clone,
) {
    let layer = ThrottleLayer::new(store, Policy::fixed_window(10, MIN).unwrap())
        .key(HeaderKey::new(HeaderName::from_static("x-user")))
        .prefix("api");
    let svc = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, std::convert::Infallible>(Response::new(
            http_body_util::Empty::<bytes::Bytes>::new(),
        ))
    }));
    (layer, svc)
}

fn as_user(user: &str) -> Request<()> {
    Request::builder().header("x-user", user).body(()).unwrap()
}

#[test]
fn a_redis_backed_layer_reports_its_hottest_keys() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::new();
        let store = Hottest::new(redis(&server, &clock).await, 16, MIN).clock(clock.clone());
        let (layer, svc) = service(store);
        let mut statuses = Vec::new();
        for i in 0..50 {
            if i < 30 {
                let res = svc.clone().oneshot(as_user("heavy")).await.unwrap();
                statuses.push(res.status());
            }
            let res = svc
                .clone()
                .oneshot(as_user(&format!("u-{i}")))
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
        let denied = statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            denied.count(),
            20,
            "Redis decided: 10 of heavy's 30 admitted"
        );

        let report = layer.store().hottest_keys(3);
        assert_eq!((report.checks, report.denials), (80, 20));
        let top = &report.by_checks[0];
        assert_eq!(
            (&*top.key, top.count, top.is_exact()),
            (&b"api:default:heavy"[..], 30, true)
        );
        let denials: Vec<String> = report.by_denials.iter().map(|k| k.to_string()).collect();
        assert_eq!(denials, ["api:default:heavy  20"]);
        // The 50 light users went through a summary of 16: their counts
        // are bounds, and read as such.
        for k in &report.by_checks[1..] {
            assert_eq!(k.lower_bound, 1, "{k}");
            assert_eq!(k.count_display().to_string(), format!("≥ 1, ≤ {}", k.count));
        }
        assert!(
            report.to_string().contains("\n  api:default:heavy  30\n"),
            "{report}"
        );
    });
}

/// The case: a fallback period with 5,000 users of about one
/// check each. Redis's decisions before it and the fallback's during it
/// are counted alike, and the keys listed read as "≥ 1", not as the
/// summary's bare upper bound.
#[test]
fn after_a_fallback_period_the_report_reads_right() {
    let mut server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::new();
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let fallback = FallbackStore::new(redis(&server, &clock).await, memory)
            .clock(clock.clone())
            .probe_interval(Duration::from_secs(3600));
        let (layer, svc) = service(Hottest::new(fallback, 41, MIN).clock(clock.clone()));
        for _ in 0..3 {
            let res = svc.clone().oneshot(as_user("before")).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
        let report = layer.store().hottest_keys(10);
        assert_eq!(report.by_checks[0].to_string(), "api:default:before  3");

        server.stop();
        for user in 0..5_000 {
            let res = svc.clone().oneshot(as_user(&format!("u-{user}"))).await;
            assert_eq!(res.unwrap().status(), StatusCode::OK);
        }
        assert!(layer.store().inner().is_on_fallback());
        let report = layer.store().hottest_keys(10);
        assert_eq!((report.checks, report.by_checks.len()), (5_003, 10));
        for k in &report.by_checks {
            let truth = if &*k.key == b"api:default:before" {
                3
            } else {
                1
            };
            assert!(k.lower_bound <= truth && truth <= k.count, "{k}");
            assert!(k
                .to_string()
                .contains(&format!("≥ {}, ≤ {}", k.lower_bound, k.count)));
        }
    });
}
