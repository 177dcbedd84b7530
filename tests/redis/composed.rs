//! The direct API's compositions and a reloaded rule table, on a real
//! `redis-server`, with time from a manual clock.

use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::lockout::Penalty;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::{Limiter, Policy};

use crate::counting_store::CountingStore;
use crate::redis_support::{current_thread_runtime, RedisServer};

const MIN: Duration = Duration::from_secs(60);

async fn store(server: &RedisServer, clock: &ManualClock, prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .time_source(TimeSource::client(clock.clone()))
        .ttl_padding(Duration::from_secs(600))
        .connect(server.url())
        .await
        .unwrap()
}

/// Two rules, all or nothing, under a lock-out: the lock is the caller's,
/// and nothing is charged to either rule while it holds.
#[test]
fn two_rules_and_a_lockout_lock_the_caller_and_charge_nothing_while_locked() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let l = Limiter::new(
            store(&server, &clock, "composed").await,
            Policy::fixed_window(1, MIN).unwrap(),
        )
        .named("minute")
        .and("hour", Policy::fixed_window(10, 60 * MIN).unwrap())
        .lockout(Penalty::new(2, 10 * MIN, 5 * MIN).unwrap())
        .with_prefix("login");
        assert!(l.check("u").await.unwrap().allowed());
        assert!(!l.check("u").await.unwrap().allowed());
        let locking = l.check("u").await.unwrap();
        assert_eq!(locking.retry_after(), Some(5 * MIN));
        assert_eq!(l.locked_for("u").await.unwrap(), Some(5 * MIN));
        assert_eq!(l.locked_for("v").await.unwrap(), None, "one caller's lock");
        clock.advance(2 * MIN);
        assert_eq!(l.check("u").await.unwrap().retry_after(), Some(3 * MIN));
        clock.advance(3 * MIN);
        let after = l.check("u").await.unwrap();
        assert!(after.allowed());
        assert_eq!(
            after.get("hour").unwrap().remaining,
            8,
            "denied and locked checks took nothing from the hour"
        );
    });
}

/// A rule table over Redis: a reload keeps the counters of the rule that
/// stays, and the new rule starts from its own.
#[cfg(feature = "config")]
#[test]
fn a_reloaded_rule_table_keeps_its_counters_on_redis() {
    use http::{Request, StatusCode};
    use tower::{Layer, Service, ServiceExt};
    use tower_throttle::config::{LayerConfig, RuleTable};

    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let reply = "key: { header: x-user-id }\nheaders_on_allowed: true\nrules:\n  - name: reply\n    policy: { sliding_log: { limit: 5, window: 60s } }\n";
        let with_day = format!(
            "{reply}  - name: day\n    policy: {{ fixed_window: {{ limit: 100, window: 1d }} }}\n"
        );
        let table = RuleTable::new(
            store(&server, &clock, "table").await,
            LayerConfig::parse("reply.yaml", reply).unwrap(),
        )
        .unwrap();
        let inner = tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        });
        let mut svc = table.layer("default").unwrap().layer(inner);
        let from = || Request::builder().header("x-user-id", "ann").body(()).unwrap();
        for _ in 0..3 {
            let r = svc.ready().await.unwrap().call(from()).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
        }
        table
            .reload(LayerConfig::parse("day.yaml", &with_day).unwrap())
            .unwrap();
        let r = svc.ready().await.unwrap().call(from()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let fields = r.headers()["ratelimit"].to_str().unwrap();
        assert!(fields.starts_with("\"reply\";r=1;"), "{fields}");
        assert!(fields.contains("\"day\";r=99;"), "{fields}");
    });
}

/// A cost settled after the response, on a real `redis-server`: the
/// handler reports 10 of an estimate of 50, and the 40 go back into the
/// window the estimate was taken from (the refund script's receipt).
#[test]
fn a_reported_cost_settles_through_the_redis_refund_script() {
    use http::{Request, Response};
    use tower::{Layer, ServiceExt};
    use tower_throttle::key::Global;
    use tower_throttle::meter::{ActualCost, ReportedCost};
    use tower_throttle::{RateLimitInfo, Rule, ThrottleLayer};

    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        // Refunds run on their own task after each response: counted, so
        // the test waits for each instead of racing it.
        let store = CountingStore::new(store(&server, &clock, "metered").await);
        let refunds = store.refunds.clone();
        let tokens = Rule::new("tokens", Policy::fixed_window(100, MIN).unwrap())
            .cost_fn(|req| {
                let max = req.headers().get("x-max").and_then(|v| v.to_str().ok());
                max.and_then(|v| v.parse().ok()).unwrap_or(0)
            })
            .settle_cost(ActualCost::Reported);
        let svc = ThrottleLayer::new(store, Policy::fixed_window(1_000, MIN).unwrap())
            .name("requests")
            .key(Global)
            .and(tokens)
            .request_info(true)
            .layer(tower::service_fn(|req: Request<()>| async move {
                let info = req.extensions().get::<RateLimitInfo>().unwrap();
                let remaining = info.get("tokens").unwrap().remaining;
                let mut response = Response::new(http_body_util::Empty::<bytes::Bytes>::new());
                response.extensions_mut().insert(ReportedCost(10));
                response
                    .headers_mut()
                    .insert("x-remaining", remaining.into());
                Ok::<_, std::convert::Infallible>(response)
            }));
        let ask = |max: u64| Request::builder().header("x-max", max).body(()).unwrap();
        for (i, want) in [(1, "50"), (2, "40"), (3, "30")] {
            let done = refunds.1.notified();
            let response = svc.clone().oneshot(ask(50)).await.unwrap();
            assert_eq!(response.headers()["x-remaining"], want, "request {i}");
            done.await;
            assert_eq!(refunds.0.load(std::sync::atomic::Ordering::SeqCst), i);
        }
        // 3 × 10 used: an estimate of 70 fits exactly, 71 would not.
        let response = svc.clone().oneshot(ask(70)).await.unwrap();
        assert_eq!(response.headers()["x-remaining"], "0");
    });
}

/// `ThrottleLayer::peek` and `reset` on a real `redis-server`: the state
/// requests left under both rules, read without a charge, then forgotten.
#[test]
fn a_layer_peeks_and_resets_a_key_on_redis() {
    use http::{Request, Response};
    use tower::{Layer, ServiceExt};
    use tower_throttle::key::HeaderKey;
    use tower_throttle::{Rule, ThrottleLayer};

    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let layer = ThrottleLayer::new(
            store(&server, &clock, "inspect").await,
            Policy::fixed_window(3, MIN).unwrap(),
        )
        .name("minute")
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .and(Rule::new("hour", Policy::token_bucket(10, 1.0).unwrap()));
        let svc = layer
            .clone()
            .layer(tower::service_fn(|_: Request<()>| async {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Empty::<
                    bytes::Bytes,
                >::new()))
            }));
        for _ in 0..2 {
            let req = Request::builder()
                .header("x-user", "alice")
                .body(())
                .unwrap();
            assert!(svc
                .clone()
                .oneshot(req)
                .await
                .unwrap()
                .status()
                .is_success());
        }
        for _ in 0..2 {
            let state = layer.peek("alice").await.unwrap();
            assert_eq!(state.get("minute").unwrap().remaining, 1);
            assert_eq!(state.get("hour").unwrap().remaining, 8);
        }
        layer.reset("alice").await.unwrap();
        let state = layer.peek("alice").await.unwrap();
        assert_eq!(state.get("minute").unwrap().remaining, 3);
        assert_eq!(state.get("hour").unwrap().remaining, 10);
    });
}
