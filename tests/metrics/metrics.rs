//! The `metrics` feature's series, read through a recorder installed for
//! this test binary: names, labels (configuration only, never request
//! data) and where each is recorded.
#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

/// `name{label=value,…}` (labels sorted) → the counter's total, or the
/// number of values a histogram recorded.
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
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
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

#[tokio::test(start_paused = true)]
async fn outcomes_are_counted_with_configuration_labels_only() {
    let recorded = Recorded::default();
    metrics::set_global_recorder(recorded.clone()).unwrap();
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
    let latency = "tower_throttle_store_latency_seconds{}";
    assert_eq!(recorded.get(latency), 0);
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
        recorded.get(latency) >= 2,
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
    assert_eq!(all.len(), 6, "{all:?}");
}
