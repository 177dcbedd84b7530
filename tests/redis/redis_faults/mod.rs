//! Redis faults against real `redis-server` processes this test controls:
//! killed mid-load and restarted, frozen with SIGSTOP and resumed, and a
//! cluster master killed and restarted.
//!
//! Load runs through two `ThrottleLayer`s sharing one store, one fail-open
//! and one fail-closed, and through the store directly. For each fault the
//! test asserts: every request is answered within the store timeout plus a
//! margin; the outcome counts per phase (200 / 429 / 503) match the fail
//! mode; no task panics or leaks; checks succeed again within a second of
//! the server being back; and a frozen server does not get a pile of stale
//! commands when it wakes up (no offline queue).
//!
//! Real time on purpose: the store timeout and the stopped process are the
//! point. Each fault lasts 1.5 s.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

mod cluster;
mod load;
mod server;

/// The store's bound on every call.
const TIMEOUT: Duration = Duration::from_millis(200);
/// What a request may take beyond it (scheduling on a loaded 2-core CI box).
const MARGIN: Duration = Duration::from_millis(300);
const TASKS: usize = 8;
const USERS: usize = 4;
/// Per user and layer, per server lifetime (state is not persisted).
const BOUND: u64 = 40;
const FAULT: Duration = Duration::from_millis(1500);

fn policy() -> Policy {
    // A day, on a manual clock (`manual_time`): a window boundary passing
    // mid-test would reset the count.
    Policy::fixed_window(BOUND, Duration::from_secs(86_400)).unwrap()
}

/// Where the stores take `now`: a clock that stands still (on the server's
/// own, even a day's window ends mid-test at midnight). The faults and the
/// bounds on answers are real time.
fn manual_time() -> TimeSource {
    TimeSource::client(ManualClock::new())
}

/// Which path a request took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Open,
    Closed,
    Store,
}

/// One request: when it started and ended (since the test's origin), by
/// which path, for which user, and its outcome (an HTTP status; for the
/// store directly 200 = decided, 503 = error).
#[derive(Clone, Copy, Debug)]
struct Rec {
    start: Duration,
    end: Duration,
    via: Via,
    user: usize,
    status: u16,
}

fn handler() -> impl tower::Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send {
    tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    })
}

/// Outcome counts of `recs` per path.
fn counts<'a>(recs: impl IntoIterator<Item = &'a Rec>) -> BTreeMap<(Via, u16), u64> {
    let mut m = BTreeMap::new();
    for r in recs {
        *m.entry((r.via, r.status)).or_default() += 1;
    }
    m
}

fn count(c: &BTreeMap<(Via, u16), u64>, via: Via, status: u16) -> u64 {
    c.get(&(via, status)).copied().unwrap_or(0)
}

/// Every request answered in time.
fn assert_bounded(recs: &[Rec]) {
    let slowest = recs.iter().map(|r| r.end - r.start).max().unwrap();
    assert!(
        slowest <= TIMEOUT + MARGIN,
        "slowest request took {slowest:?} (timeout {TIMEOUT:?})"
    );
}

/// Live tasks once the store is warm (its connection and batcher tasks run).
async fn baseline_tasks<St: Store>(store: &St) -> usize {
    let warm = Policy::cell(0, 1, Duration::from_millis(1)).unwrap();
    store
        .check(Charge::new(b"warm-up", &warm, 1))
        .await
        .unwrap();
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits (≤ 2 s) for the runtime's live tasks to drop back to `baseline`.
async fn assert_no_task_leak(baseline: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(2);
    while metrics.num_alive_tasks() > baseline && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        metrics.num_alive_tasks() <= baseline,
        "{} tasks alive after the load, {baseline} before",
        metrics.num_alive_tasks()
    );
}

fn plain_user(u: usize) -> String {
    format!("user{u}")
}

fn frozen_user(u: usize) -> String {
    format!("frozen{u}")
}

fn back_user(u: usize) -> String {
    format!("back{u}")
}

async fn store_on(url: String) -> RedisStore {
    RedisStore::builder()
        .prefix("f")
        .timeout(TIMEOUT)
        .time_source(manual_time())
        .connect(url)
        .await
        .unwrap()
}

/// Phase boundaries of one fault, since the origin.
struct Phases {
    fault_start: Duration,
    /// When the fault began to be undone (restart or `SIGCONT` issued): a
    /// restarted server may answer before its restart call returns.
    undo_start: Duration,
    fault_end: Duration,
}

impl Phases {
    /// Requests wholly inside the fault (after a grace for the signal to land).
    fn during<'a>(&self, recs: &'a [Rec]) -> impl Iterator<Item = &'a Rec> + 'a {
        let (from, to) = (
            self.fault_start + Duration::from_millis(50),
            self.undo_start,
        );
        recs.iter().filter(move |r| r.start >= from && r.end <= to)
    }

    fn before<'a>(&self, recs: &'a [Rec]) -> impl Iterator<Item = &'a Rec> + 'a {
        let to = self.fault_start;
        recs.iter().filter(move |r| r.end <= to)
    }

    /// Requests started more than a second after the server was back.
    fn recovered<'a>(&self, recs: &'a [Rec]) -> impl Iterator<Item = &'a Rec> + 'a {
        let from = self.fault_end + Duration::from_secs(1);
        recs.iter().filter(move |r| r.start >= from)
    }

    /// How long after the server was back the first check of `via` succeeded.
    fn recovery(&self, recs: &[Rec], via: Via) -> Duration {
        recs.iter()
            .filter(|r| r.via == via && r.start >= self.fault_end && r.status != 503)
            .map(|r| r.end - self.fault_end)
            .min()
            .expect("no successful check after recovery")
    }
}

/// The common verdict on one fault, whatever it was.
fn assert_fault_outcomes(name: &str, recs: &[Rec], phases: &Phases) {
    assert_bounded(recs);
    let before = counts(phases.before(recs));
    let during = counts(phases.during(recs));
    let after = counts(phases.recovered(recs));
    println!("{name}: before {before:?}\n{name}: during {during:?}\n{name}: after {after:?}");
    for via in [Via::Open, Via::Closed, Via::Store] {
        assert_eq!(count(&before, via, 503), 0, "{name}: {via:?} failed before");
        assert!(count(&before, via, 429) > 0, "{name}: {via:?} saw no 429");
        assert_eq!(count(&after, via, 503), 0, "{name}: {via:?} failed after");
        assert!(count(&after, via, 200) + count(&after, via, 429) > 0);
        let recovery = phases.recovery(recs, via);
        assert!(
            recovery <= Duration::from_secs(1),
            "{name}: {via:?} recovered after {recovery:?}"
        );
    }
    // During the fault: fail-open forwards everything, fail-closed answers
    // 503, the store reports an error: nothing else.
    let total: u64 = during.values().sum();
    assert!(
        total >= 30,
        "{name}: only {total} requests during the fault"
    );
    assert_eq!(
        count(&during, Via::Open, 200),
        during
            .iter()
            .filter(|((v, _), _)| *v == Via::Open)
            .map(|(_, n)| n)
            .sum::<u64>(),
        "{name}: fail-open answered something else than 200 during the fault"
    );
    for via in [Via::Closed, Via::Store] {
        assert_eq!(
            count(&during, via, 503),
            during
                .iter()
                .filter(|((v, _), _)| *v == via)
                .map(|(_, n)| n)
                .sum::<u64>(),
            "{name}: {via:?} answered something else than 503 during the fault"
        );
    }
}

/// Admissions of the limited paths per key, outside the fault, never above
/// the bound (every phase uses fresh keys, so one server lifetime each).
fn assert_admitted_within_bound(name: &str, recs: &[Rec], phases: &Phases) {
    let mut admitted: BTreeMap<(Via, usize), u64> = BTreeMap::new();
    for r in recs
        .iter()
        .filter(|r| r.via != Via::Open && r.status == 200)
    {
        if r.end <= phases.fault_start || r.start >= phases.fault_end {
            *admitted.entry((r.via, r.user)).or_default() += 1;
        }
    }
    assert!(!admitted.is_empty());
    for ((via, user), n) in admitted {
        assert!(
            n <= BOUND,
            "{name}: {via:?} user {user} admitted {n} > {BOUND}"
        );
    }
}
