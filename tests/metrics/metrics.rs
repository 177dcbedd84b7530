//! The `metrics` feature's series, read through a recorder installed for
//! this test binary: names, labels (configuration only, never request
//! data) and where each is recorded.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

#[path = "../support/counting_store.rs"]
mod counting_store;
use counting_store::CountingStore;

/// `name{label=value,…}` (labels sorted) → the counter's total, the
/// number of values a histogram recorded, or a gauge's value.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<BTreeMap<String, u64>>>);

struct Series {
    name: String,
    all: Recorded,
}

impl Series {
    fn add(&self, n: u64) {
        *self
            .all
            .0
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += n;
    }
}

impl CounterFn for Series {
    fn increment(&self, value: u64) {
        self.add(value);
    }
    fn absolute(&self, _: u64) {
        unreachable!("the layer only increments");
    }
}

impl GaugeFn for Series {
    fn increment(&self, _: f64) {
        unreachable!("the layer only sets gauges");
    }
    fn decrement(&self, _: f64) {
        unreachable!("the layer only sets gauges");
    }
    fn set(&self, value: f64) {
        (self.all.0.lock().unwrap()).insert(self.name.clone(), value as u64);
    }
}

impl HistogramFn for Series {
    fn record(&self, _: f64) {
        self.add(1);
    }
}

impl Recorded {
    fn series(&self, key: &Key) -> Arc<Series> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        Arc::new(Series {
            name: format!("{}{{{}}}", key.name(), labels.join(",")),
            all: self.clone(),
        })
    }

    fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.series(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.series(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.series(key))
    }
}

const USER: HeaderName = HeaderName::from_static("x-user");

fn request(user: Option<&str>) -> Request<()> {
    let mut req = Request::builder();
    if let Some(user) = user {
        req = req.header(USER, user);
    }
    req.body(()).unwrap()
}

async fn ok(_: Request<()>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(Response::new(Full::new(Bytes::new())))
}

/// The tests of this binary, one at a time: the store-latency histogram has
/// no prefix label, so a test counts its records as a difference, which
/// another test's calls through the store's futures must not enter.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The recorder of this binary, installed once; each test reads the series
/// of its own prefixes.
fn recorded() -> Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED
        .get_or_init(|| {
            let recorded = Recorded::default();
            metrics::set_global_recorder(recorded.clone()).unwrap();
            recorded
        })
        .clone()
}

#[tokio::test(start_paused = true)]
async fn outcomes_are_counted_with_configuration_labels_only() {
    let _serial = SERIAL.lock().await;
    let recorded = recorded();
    // The histogram has no labels: count this test's records only.
    let latency = "tower_throttle_store_latency_seconds{}";
    let latency_before = recorded.get(latency);
    let minute = Duration::from_secs(60);
    // Stores on a clock that stands still: a minute boundary (or, below,
    // 10 ms of a stalled machine) between two requests would change which
    // are limited or delayed.
    let store = || MemoryStore::builder().clock(ManualClock::new()).build();
    let svc = ThrottleLayer::new(store(), Policy::fixed_window(1, minute).unwrap())
        .name("burst")
        .key(HeaderKey::new(USER))
        .and(Rule::new("day", Policy::fixed_window(100, minute).unwrap()))
        .prefix("api")
        .layer(tower::service_fn(ok));
    let statuses = [
        svc.clone()
            .oneshot(request(Some("user-1")))
            .await
            .unwrap()
            .status(),
        svc.clone()
            .oneshot(request(Some("user-1")))
            .await
            .unwrap()
            .status(),
        svc.clone().oneshot(request(None)).await.unwrap().status(),
    ];
    assert_eq!(
        statuses[..2],
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
    let total = "tower_throttle_requests_total";
    // Admitted: every rule's name; denied: the rule that denied; no key:
    // the rule that found none.
    assert_eq!(
        recorded.get(&format!(
            "{total}{{outcome=allowed,prefix=api,rule=burst+day}}"
        )),
        1
    );
    assert_eq!(
        recorded.get(&format!("{total}{{outcome=limited,prefix=api,rule=burst}}")),
        1
    );
    assert_eq!(
        recorded.get(&format!(
            "{total}{{outcome=missing_key,prefix=api,rule=burst}}"
        )),
        1
    );
    // In-process answers are not timed: the histogram is for store calls
    // made through a future (remote stores, delay mode).
    assert_eq!(recorded.get(latency), latency_before);
    let delayed = ThrottleLayer::new(
        store(),
        Policy::cell(0, 1, Duration::from_millis(10)).unwrap(),
    )
    .key(Global)
    .prefix("slow")
    .delay_up_to(Duration::from_secs(1))
    .layer(tower::service_fn(ok));
    for _ in 0..2 {
        let status = delayed
            .clone()
            .oneshot(request(None))
            .await
            .unwrap()
            .status();
        assert_eq!(status, StatusCode::OK);
    }
    assert!(
        recorded.get(latency) >= latency_before + 2,
        "{:?}",
        recorded.0.lock().unwrap()
    );
    assert_eq!(
        recorded.get(&format!(
            "{total}{{outcome=delayed,prefix=slow,rule=default}}"
        )),
        1
    );
    // No series carries request data.
    let all = recorded.0.lock().unwrap();
    assert!(all.keys().all(|k| !k.contains("user-1")), "{all:?}");
    let outcomes = all.keys().filter(|k| {
        k.starts_with(total) && (k.contains("prefix=api") || k.contains("prefix=slow"))
    });
    assert_eq!(outcomes.count(), 5, "{all:?}");
}

/// Sends `n` requests of `user`; the statuses.
async fn send<S>(svc: &S, user: &str, n: usize) -> Vec<u16>
where
    S: tower::Service<
            Request<()>,
            Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    let mut statuses = Vec::new();
    for _ in 0..n {
        let response = svc.clone().oneshot(request(Some(user))).await.unwrap();
        statuses.push(response.status().as_u16());
    }
    statuses
}

#[tokio::test(start_paused = true)]
async fn near_limit_admissions_and_the_applied_limits_are_recorded() {
    let _serial = SERIAL.lock().await;
    let recorded = recorded();
    let minute = Duration::from_secs(60);
    let store = || MemoryStore::builder().clock(ManualClock::new()).build();
    let near = "tower_throttle_near_limit_total";

    // One rule (the layer's fast lane): the 5th of 5 is near the limit; the
    // 6th is denied, not near.
    let simple = ThrottleLayer::new(store(), Policy::fixed_window(5, minute).unwrap())
        .key(HeaderKey::new(USER))
        .prefix("near-simple")
        .layer(tower::service_fn(ok));
    assert_eq!(send(&simple, "u", 6).await, [200, 200, 200, 200, 200, 429]);
    assert_eq!(
        recorded.get(&format!(
            "{near}{{limit=5,prefix=near-simple,rule=default}}"
        )),
        1
    );
    assert_eq!(
        recorded.get("tower_throttle_rule_limit{prefix=near-simple,rule=default}"),
        5
    );
    assert_eq!(
        recorded.get("tower_throttle_rule_window_seconds{prefix=near-simple,rule=default}"),
        60
    );

    // 81..=100 of 100 are near, by default.
    let hundred = ThrottleLayer::new(store(), Policy::fixed_window(100, minute).unwrap())
        .key(HeaderKey::new(USER))
        .prefix("near-hundred")
        .layer(tower::service_fn(ok));
    send(&hundred, "u", 100).await;
    assert_eq!(
        recorded.get(&format!(
            "{near}{{limit=100,prefix=near-hundred,rule=default}}"
        )),
        20
    );

    // A policy per request (tiers): one series per limit applied.
    let tiers = ThrottleLayer::new(store(), Policy::fixed_window(2, minute).unwrap())
        .key(HeaderKey::new(USER))
        .policy_fn(|req| {
            let premium = req.headers().get(USER).is_some_and(|u| u == "premium");
            premium.then(|| Policy::fixed_window(4, Duration::from_secs(60)).unwrap())
        })
        .prefix("near-tiers")
        .layer(tower::service_fn(ok));
    send(&tiers, "basic", 2).await;
    send(&tiers, "premium", 4).await;
    for limit in [2, 4] {
        let series = format!("{near}{{limit={limit},prefix=near-tiers,rule=default}}");
        assert_eq!(recorded.get(&series), 1, "{series}");
    }

    // Two rules through the store's futures, with a ratio of one half:
    // 6..=10 of 10 are near; the hourly rule never is; a denial by the
    // first rule counts nothing for the second.
    let hour = Duration::from_secs(3600);
    let two = ThrottleLayer::new(
        CountingStore::new(store()),
        Policy::fixed_window(10, minute).unwrap(),
    )
    .name("minute")
    .and(Rule::new(
        "hour",
        Policy::fixed_window(1_000, hour).unwrap(),
    ))
    .key(HeaderKey::new(USER))
    .prefix("near-two")
    .near_limit_ratio(0.5)
    .layer(tower::service_fn(ok));
    let statuses = send(&two, "u", 12).await;
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 10);
    assert_eq!(
        recorded.get(&format!("{near}{{limit=10,prefix=near-two,rule=minute}}")),
        5
    );
    assert_eq!(
        recorded.get(&format!("{near}{{limit=1000,prefix=near-two,rule=hour}}")),
        0
    );
    assert_eq!(
        recorded.get("tower_throttle_rule_limit{prefix=near-two,rule=hour}"),
        1_000
    );
    assert_eq!(
        recorded.get("tower_throttle_rule_window_seconds{prefix=near-two,rule=hour}"),
        3_600
    );

    // The ratio's edges on GCRA, whose admissions the memory store gives
    // without figures when none are read: 0 counts every admission, 0.99
    // the 5th of 5 (figures read: a figure-free admission would look full
    // and count every time), 1 none; in the fast lane and on the general
    // path (`request_info`).
    for (ratio, counted) in [(0.0, 5), (0.99, 1), (1.0, 0)] {
        for info in [false, true] {
            let prefix = format!("near-edge-{ratio}-{info}");
            let five = Policy::cell(4, 1, minute).unwrap();
            let edge = ThrottleLayer::new(store(), five)
                .key(HeaderKey::new(USER))
                .prefix(prefix.as_str())
                .near_limit_ratio(ratio)
                .request_info(info)
                .layer(tower::service_fn(ok));
            assert_eq!(send(&edge, "u", 6).await, [200, 200, 200, 200, 200, 429]);
            let series = format!("{near}{{limit=5,prefix={prefix},rule=default}}");
            assert_eq!(recorded.get(&series), counted, "{series}");
        }
    }
}
