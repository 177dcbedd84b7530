//! Layers read from files (feature `config`), and a rule table replaced
//! while requests are in flight, on a manual clock.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{LayerConfig, RuleTable};
use tower_throttle::decision::Receipt;
use tower_throttle::store::RuleSpec;
use tower_throttle::{MemoryStore, Policy, Store, StoreError};

/// A file in a directory of this test's own.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-throttle-config-file-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

const REPLY: &str = "\
key: { header: x-user-id }
headers_on_allowed: true
rules:
  - name: reply
    policy: { sliding_log: { limit: 5, window: 60s } }
";

const REPLY_AND_DAY: &str = "\
key: { header: x-user-id }
headers_on_allowed: true
rules:
  - name: reply
    policy: { sliding_log: { limit: 5, window: 60s } }
  - name: day
    policy: { fixed_window: { limit: 100, window: 1d } }
";

fn frozen() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

fn from(user: &str) -> Request<()> {
    Request::builder()
        .header("x-user-id", user)
        .body(())
        .unwrap()
}

/// Answers at once, except the first call, which waits for `release`.
#[derive(Clone)]
struct HoldFirst(Arc<Mutex<Option<oneshot::Receiver<()>>>>);

impl Service<Request<()>> for HoldFirst {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let held = self.0.lock().unwrap().take();
        Box::pin(async move {
            if let Some(release) = held {
                let _ = release.await;
            }
            Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
        })
    }
}

fn hold_first() -> (HoldFirst, oneshot::Sender<()>) {
    let (release, held) = oneshot::channel();
    (HoldFirst(Arc::new(Mutex::new(Some(held)))), release)
}

#[tokio::test]
async fn a_layer_from_a_file_limits_as_written() {
    let path = file("limits.yaml", REPLY);
    let table = RuleTable::from_path(frozen(), &path).unwrap();
    let (inner, release) = hold_first();
    drop(release); // no call waits
    let mut svc = table.layer("default").unwrap().layer(inner);
    for _ in 0..5 {
        let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["ratelimit-policy"], "\"reply\";q=5;w=60");
    }
    let denied = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = svc.ready().await.unwrap().call(from("bob")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK, "the key is the header's");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// A request in flight finishes on the rules it started with; the next
/// request runs on the new ones; the rule that stayed keeps its counter.
#[tokio::test]
async fn a_reload_swaps_the_rules_between_requests_and_keeps_unchanged_counters() {
    let table = RuleTable::new(frozen(), LayerConfig::parse("a.yaml", REPLY).unwrap()).unwrap();
    let (inner, release) = hold_first();
    let mut svc = table.layer("default").unwrap().layer(inner);
    let in_flight = svc.ready().await.unwrap().call(from("ann"));
    let in_flight = tokio::spawn(in_flight);
    let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(r.headers()["ratelimit-policy"], "\"reply\";q=5;w=60");

    table
        .reload(LayerConfig::parse("b.yaml", REPLY_AND_DAY).unwrap())
        .unwrap();
    assert_eq!(table.generation(), 1);
    let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["ratelimit-policy"],
        "\"reply\";q=5;w=60, \"day\";q=100;w=86400"
    );
    // Three taken from `reply` across the reload; `day` started at the reload.
    assert_eq!(
        r.headers()["ratelimit"],
        "\"reply\";r=2;t=60, \"day\";r=99;t=86400"
    );

    release.send(()).unwrap();
    let old = in_flight.await.unwrap().unwrap();
    assert_eq!(old.status(), StatusCode::OK);
    assert_eq!(
        old.headers()["ratelimit-policy"],
        "\"reply\";q=5;w=60",
        "the request in flight answered on the rules it started with"
    );
}

/// A tighter policy for a rule that stays reads the counter it has.
#[tokio::test]
async fn a_tightened_rule_applies_to_what_was_already_counted() {
    let table = RuleTable::new(frozen(), LayerConfig::parse("a.yaml", REPLY).unwrap()).unwrap();
    let (inner, release) = hold_first();
    drop(release);
    let mut svc = table.layer("default").unwrap().layer(inner);
    for _ in 0..3 {
        let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let tighter = REPLY.replace("limit: 5", "limit: 3");
    table
        .reload(LayerConfig::parse("a.yaml", &tighter).unwrap())
        .unwrap();
    let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "3 of 3 already taken"
    );
    assert_eq!(r.headers()["ratelimit-policy"], "\"reply\";q=3;w=60");
}

/// A file that does not parse, or rules the store refuses, leave the
/// running rules as they were, and say why.
#[tokio::test]
async fn a_refused_reload_keeps_the_running_rules() {
    let path = file("running.yaml", REPLY);
    let table = RuleTable::new(
        NoSlidingLogsOver(frozen(), 10),
        LayerConfig::from_path(&path).unwrap(),
    )
    .unwrap();
    std::fs::write(
        &path,
        "rules:\n  - name: reply\n    policy: { sliding_log: { limit: 0, window: 60s } }\n",
    )
    .unwrap();
    let e = table.reload_from_path(&path).unwrap_err();
    assert_eq!(e.source, path.display().to_string());
    assert_eq!(
        (e.line, e.field.as_deref()),
        (Some(3), Some("rules[0].policy"))
    );

    let refused = REPLY_AND_DAY.replace(
        "{ fixed_window: { limit: 100, window: 1d } }",
        "{ sliding_log: { limit: 100, window: 1d } }",
    );
    std::fs::write(&path, &refused).unwrap();
    let e = table.reload_from_path(&path).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("rules[1]"), "{e}");
    assert!(e.to_string().contains("day"), "the rule is named: {e}");
    assert_eq!(table.generation(), 0);

    let (inner, release) = hold_first();
    drop(release);
    let mut svc = table.layer("default").unwrap().layer(inner);
    for _ in 0..5 {
        svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    }
    let r = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["ratelimit-policy"], "\"reply\";q=5;w=60");
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// A lock-out written in the file holds across a reload that keeps it.
#[tokio::test]
async fn a_lockout_from_a_file_survives_a_reload() {
    let with_lockout = format!("lockout: {{ strikes: 2, within: 10m, lock: 1h }}\n{REPLY}");
    let table = RuleTable::new(
        frozen(),
        LayerConfig::parse("l.yaml", &with_lockout).unwrap(),
    )
    .unwrap();
    let (inner, release) = hold_first();
    drop(release);
    let mut svc = table.layer("default").unwrap().layer(inner);
    for _ in 0..5 {
        svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    }
    svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    let locked = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(locked.headers()["retry-after"], "3600");
    let more = with_lockout.replace("limit: 5", "limit: 50");
    table
        .reload(LayerConfig::parse("l.yaml", &more).unwrap())
        .unwrap();
    let still = svc.ready().await.unwrap().call(from("ann")).await.unwrap();
    assert_eq!(still.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(still.headers()["retry-after"], "3600", "the lock holds");
}

/// A store that refuses sliding logs above `max` (as Redis caps them).
struct NoSlidingLogsOver(MemoryStore<ManualClock>, u64);

impl Store for NoSlidingLogsOver {
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
        self.0.decide(charges)
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &Receipt,
    ) -> Result<(), StoreError> {
        self.0.refund(key, policy, receipt).await
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.0.reset(key, policy).await
    }

    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        let too_long = rules.iter().any(|r| {
            matches!(
                r.policy.algorithm(),
                tower_throttle::policy::Algorithm::SlidingLog(_)
            ) && r.policy.limit() > self.1
        });
        match too_long {
            true => Err(StoreError::Unsupported("sliding logs this long")),
            false => Ok(()),
        }
    }
}
