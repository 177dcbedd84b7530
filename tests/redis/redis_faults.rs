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

use crate::redis_support;

use crate::faults;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redis::aio::ConnectionLike;
use redis_support::{runtime, RedisCluster, RedisServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::HeaderKey;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{FailMode, Policy, Store, StoreError, ThrottleLayer};

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

/// Load on one store: `TASKS` tasks, each cycling through the open layer, the
/// closed layer and the store, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    /// Bumped to move the load to fresh keys: user `u` of generation `g` is
    /// `g * users + u`. Keys already denied are answered from the store's
    /// local denial cache whatever the server's state, so each fault is met
    /// with keys the store has not denied yet.
    generation: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Rec>>>,
}

impl Load {
    fn start<St>(store: St, origin: Instant, users: usize, user_key: fn(usize) -> String) -> Load
    where
        St: Store + Clone,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicUsize::new(0));
        let layer = |fail: FailMode, prefix: &str| {
            ThrottleLayer::new(store.clone(), policy())
                .name("r")
                .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
                .prefix(prefix)
                .fail_mode(fail)
        };
        let open = ServiceBuilder::new()
            .layer(layer(FailMode::Open, "open"))
            .service(handler());
        let closed = ServiceBuilder::new()
            .layer(layer(FailMode::Closed, "closed"))
            .service(handler());
        let tasks = (0..TASKS)
            .map(|task| {
                let (open, closed, store, stop, generation) = (
                    open.clone(),
                    closed.clone(),
                    store.clone(),
                    stop.clone(),
                    generation.clone(),
                );
                tokio::spawn(async move {
                    let policy = policy();
                    let mut recs = Vec::new();
                    let mut n = task;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let user = generation.load(Ordering::Relaxed) * users + n % users;
                        for via in [Via::Open, Via::Closed, Via::Store] {
                            let req = Request::builder()
                                .header("x-user", user_key(user))
                                .body(())
                                .unwrap();
                            let start = origin.elapsed();
                            let status = match via {
                                Via::Open => open.clone().oneshot(req).await.unwrap().status(),
                                Via::Closed => closed.clone().oneshot(req).await.unwrap().status(),
                                Via::Store => {
                                    let key = format!("store:{}", user_key(user));
                                    match store.check(Charge::new(key.as_bytes(), &policy, 1)).await
                                    {
                                        Ok(d) if d.allowed => StatusCode::OK,
                                        Ok(_) => StatusCode::TOO_MANY_REQUESTS,
                                        Err(e) if e.is_unavailable() => {
                                            StatusCode::SERVICE_UNAVAILABLE
                                        }
                                        Err(e) => panic!("unexpected store error: {e:?}"),
                                    }
                                }
                            };
                            recs.push(Rec {
                                start,
                                end: origin.elapsed(),
                                via,
                                user,
                                status: status.as_u16(),
                            });
                        }
                        // Pacing only (a dead server fails fast): not synchronisation.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    recs
                })
            })
            .collect();
        Load {
            stop,
            generation,
            tasks,
        }
    }

    /// Moves the load to fresh keys.
    fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops the tasks and gathers their records; a panicking task fails the test.
    async fn finish(self) -> Vec<Rec> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("a load task panicked"));
        }
        all
    }
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

#[test]
fn server_killed_mid_load_then_restarted() {
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = store_on(server.url()).await;
        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let load = Load::start(store.clone(), origin, USERS, plain_user);
        tokio::time::sleep(Duration::from_millis(700)).await;

        let fault_start = origin.elapsed();
        load.next_generation();
        tokio::task::block_in_place(|| server.stop());
        tokio::time::sleep(FAULT).await;
        let undo_start = origin.elapsed();
        tokio::task::block_in_place(|| server.start_again());
        let fault_end = origin.elapsed();
        load.next_generation();
        tokio::time::sleep(Duration::from_millis(1800)).await;
        let recs = load.finish().await;

        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_fault_outcomes("kill", &recs, &phases);
        assert_admitted_within_bound("kill", &recs, &phases);
        assert_no_task_leak(baseline).await;
    });
}

#[test]
fn server_frozen_with_sigstop_then_resumed() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = store_on(server.url()).await;
        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let mut recs = Load::start(store.clone(), origin, USERS, plain_user)
            .finish_after(Duration::from_millis(700))
            .await;

        // Quiet: count the scripts the server ran, then freeze it under load.
        let scripts_before = tokio::task::block_in_place(|| faults::script_calls(&server));
        let fault_start = origin.elapsed();
        let paused = tokio::task::block_in_place(|| faults::Paused::pause(&server));
        // Fresh keys, used only while frozen: whatever they hold afterwards
        // was charged by a stale check.
        let load = Load::start(store.clone(), origin, USERS, frozen_user);
        tokio::time::sleep(FAULT).await;
        let frozen = load.finish().await;
        let sent_while_frozen = frozen.iter().filter(|r| r.start >= fault_start).count();
        recs.extend(frozen);
        let undo_start = origin.elapsed();
        paused.resume();
        let fault_end = origin.elapsed();
        // What the woken server executes now was sent while it was frozen.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let scripts_after = tokio::task::block_in_place(|| faults::script_calls(&server));
        let stale = scripts_after - scripts_before;
        println!("sigstop: {sent_while_frozen} calls while frozen, {stale} executed after SIGCONT");

        let mut stale_units = 0;
        for via in [Via::Open, Via::Closed, Via::Store] {
            for user in 0..USERS {
                let key = match via {
                    Via::Open => format!("open:r:{}", frozen_user(user)),
                    Via::Closed => format!("closed:r:{}", frozen_user(user)),
                    Via::Store => format!("store:{}", frozen_user(user)),
                };
                let peek = store
                    .check(Charge::new(key.as_bytes(), &policy(), 0))
                    .await
                    .unwrap();
                stale_units += BOUND - peek.remaining;
            }
        }
        println!("sigstop: {stale_units} units charged by stale checks");
        // In flight when it froze: one check per task, and with batching one
        // more per task (a caller that timed out queues its next check before
        // its batch's own timeout trips the breaker). Without the breaker:
        // nearly every check sent while frozen.
        assert!(
            stale_units <= 2 * TASKS as u64,
            "{stale_units} units charged after SIGCONT by checks already answered"
        );
        assert!(
            stale <= 2 * TASKS as u64,
            "{stale} stale scripts ran after SIGCONT ({sent_while_frozen} calls while frozen): \
             commands queued while Redis was unresponsive"
        );
        // The frozen phase's records count as the fault's, under the plain users.
        for r in recs.iter_mut().filter(|r| r.start >= fault_start) {
            r.user += USERS;
        }
        let recs_before_recovery = recs.len();

        recs.extend(
            Load::start(store.clone(), origin, USERS, back_user)
                .finish_after(Duration::from_millis(1800))
                .await,
        );
        for r in &mut recs[recs_before_recovery..] {
            r.user += 2 * USERS;
        }
        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_fault_outcomes("sigstop", &recs, &phases);
        assert_admitted_within_bound("sigstop", &recs, &phases);
        assert_no_task_leak(baseline).await;
    });
}

impl Load {
    async fn finish_after(self, after: Duration) -> Vec<Rec> {
        tokio::time::sleep(after).await;
        self.finish().await
    }
}

#[test]
fn store_calls_on_a_frozen_server_time_out_and_hold_nothing() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = store_on(server.url()).await;
        frozen_calls_time_out(&server, store).await;
    });
}

/// With a batch queue of one, callers wait for room within their store
/// timeout (backpressure), then fail with `StoreError::Timeout` like the
/// others: none waits longer, none fails otherwise.
#[test]
fn a_full_batch_queue_makes_callers_wait_then_time_out() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::builder()
            .prefix("f")
            .timeout(TIMEOUT)
            .batch_queue(1)
            .connect(server.url())
            .await
            .unwrap();
        frozen_calls_time_out(&server, store).await;
    });
}

/// Freezes `server` under 64 concurrent calls: each fails with a timeout
/// within the bound, a plain command through the connection is bounded
/// too, and the store answers again within a second of the server.
async fn frozen_calls_time_out(server: &RedisServer, store: RedisStore) {
    let p = policy();
    assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
    let paused = tokio::task::block_in_place(|| faults::Paused::pause(server));
    // Many concurrent calls, each bounded by the timeout.
    let t0 = Instant::now();
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                let t = Instant::now();
                let r = store.check(Charge::new(key.as_bytes(), &policy(), 1)).await;
                (t.elapsed(), r.map(|d| d.allowed))
            })
        })
        .collect();
    for c in calls {
        let (took, r) = c.await.unwrap();
        assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
        assert!(took <= TIMEOUT + MARGIN, "{took:?}");
    }
    assert!(t0.elapsed() <= TIMEOUT + MARGIN, "{:?}", t0.elapsed());
    // A plain command through the same connection is bounded too.
    let mut conn = store.connection().clone();
    let ping = tokio::time::timeout(TIMEOUT + MARGIN, async {
        conn.req_packed_command(&redis::cmd("PING")).await
    })
    .await;
    assert!(
        !matches!(ping, Ok(Ok(_))),
        "a frozen server answered PING: {ping:?}"
    );
    paused.resume();
    let t = Instant::now();
    loop {
        match store.check(Charge::new(b"k", &p, 1)).await {
            Ok(d) => {
                assert!(d.allowed);
                break;
            }
            Err(e) => assert!(t.elapsed() < Duration::from_secs(1), "no recovery: {e:?}"),
        }
    }
}

/// Waits (≤ 10 s) until `node` reports `cluster_state:ok`.
fn cluster_ok(node: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.conn())
            .unwrap_or_default();
        if info.contains("cluster_state:ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "cluster not ok again within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cluster_user(u: usize) -> String {
    format!("cu{u}")
}

const CLUSTER_USERS: usize = 12;

/// The key a request of `via` for `user` is charged to.
fn cluster_key(via: Via, user: usize) -> String {
    match via {
        Via::Open => format!("open:r:{}", cluster_user(user)),
        Via::Closed => format!("closed:r:{}", cluster_user(user)),
        Via::Store => format!("store:{}", cluster_user(user)),
    }
}

#[test]
fn cluster_master_killed_then_restarted() {
    let mut cluster = RedisCluster::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::builder()
            .prefix("f")
            .timeout(TIMEOUT)
            .time_source(manual_time())
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        // Which (path, user) keys live on the master we kill.
        let victim = cluster.nodes[2].port;
        let p = policy();
        let on_victim = |via: Via, user: usize| {
            let key = store.redis_key(cluster_key(via, user).as_bytes(), &p);
            let slot = faults::keyslot(&cluster.nodes[0], &key);
            faults::master_port_of_slot(&cluster.nodes[0], slot) == victim
        };
        let mut victims = BTreeMap::new();
        for via in [Via::Open, Via::Closed, Via::Store] {
            for user in 0..3 * CLUSTER_USERS {
                victims.insert((via, user), on_victim(via, user));
            }
        }
        for via in [Via::Open, Via::Closed, Via::Store] {
            let fault_users = CLUSTER_USERS..2 * CLUSTER_USERS;
            let n = fault_users.filter(|&u| victims[&(via, u)]).count();
            assert!(n > 0 && n < CLUSTER_USERS, "{via:?}: {n} users on the victim");
        }

        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let load = Load::start(store.clone(), origin, CLUSTER_USERS, cluster_user);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fault_start = origin.elapsed();
        load.next_generation();
        tokio::task::block_in_place(|| cluster.nodes[2].stop());
        // Shorter than the cluster's node timeout (5 s): the other masters
        // keep serving their slots.
        tokio::time::sleep(FAULT).await;
        let undo_start = origin.elapsed();
        tokio::task::block_in_place(|| cluster.nodes[2].start_again());
        let restarted = origin.elapsed();
        // Back in service once the restarted master sees the cluster as ok.
        tokio::task::block_in_place(|| cluster_ok(&cluster.nodes[2]));
        let fault_end = origin.elapsed();
        load.next_generation();
        println!("cluster: master answers PING at {restarted:?}, cluster ok at {fault_end:?}");
        tokio::time::sleep(Duration::from_millis(1800)).await;
        let recs = load.finish().await;
        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_bounded(&recs);
        let (hit, spared): (Vec<Rec>, Vec<Rec>) =
            recs.iter().partition(|r| victims[&(r.via, r.user)]);
        let before = counts(phases.before(&recs));
        let hit_during = counts(phases.during(&hit));
        let spared_during = counts(phases.during(&spared));
        let after = counts(phases.recovered(&recs));
        println!("cluster: before {before:?}\ncluster: victim's keys during {hit_during:?}\ncluster: other keys during {spared_during:?}\ncluster: after {after:?}");
        for via in [Via::Open, Via::Closed, Via::Store] {
            assert_eq!(count(&before, via, 503), 0, "{via:?} failed before");
            assert_eq!(count(&after, via, 503), 0, "{via:?} failed after");
            // Keys on the surviving masters are served throughout.
            assert_eq!(count(&spared_during, via, 503), 0, "{via:?} on live masters");
            assert!(count(&spared_during, via, 200) + count(&spared_during, via, 429) > 0);
            let recovery = phases.recovery(&hit, via);
            assert!(
                recovery <= Duration::from_secs(1),
                "{via:?} on the restarted master recovered after {recovery:?}"
            );
        }
        // Keys on the dead master: per the fail mode.
        let total = |c: &BTreeMap<(Via, u16), u64>, via: Via| -> u64 {
            c.iter().filter(|((v, _), _)| *v == via).map(|(_, n)| n).sum()
        };
        // Every path saw the fault. A failing call may take the whole timeout,
        // so the count is bounded by TASKS × FAULT ÷ TIMEOUT over three paths
        // (about 20 each); only its presence is asserted, not a rate.
        for via in [Via::Open, Via::Closed, Via::Store] {
            assert!(total(&hit_during, via) >= 3, "{via:?}: {hit_during:?}");
        }
        assert_eq!(count(&hit_during, Via::Open, 200), total(&hit_during, Via::Open));
        assert_eq!(count(&hit_during, Via::Closed, 503), total(&hit_during, Via::Closed));
        assert_eq!(count(&hit_during, Via::Store, 503), total(&hit_during, Via::Store));
        assert_no_task_leak(baseline).await;
    });
}
