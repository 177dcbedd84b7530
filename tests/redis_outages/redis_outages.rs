//! Every Redis outage is an outage: a real `redis-server` that answers but
//! cannot decide (out of memory under `noeviction`, busy with another
//! client's script, loading its data, a replica, a replica without its
//! master, a script cache that a reload does not refill) fails each check
//! with `StoreError::Unavailable` naming the state, under every algorithm,
//! batched or not. Through a `FallbackStore` every check is then decided by
//! the fallback (the limit holds there), and a fail-closed layer with a
//! fallback answers no 503 at all. When the state ends the store decides on
//! Redis again. A reply the crate does not understand is a defect instead:
//! not sent to the fallback, and logged at error level once per cause.

use crate::redis_support;

use crate::outages;

use crate::capture;

use crate::decided_by;

use std::time::{Duration, Instant};

use capture::Capture;
use decided_by::handler;
use http::Request;
use outages::*;
use redis::aio::ConnectionLike;
use redis_support::{current_thread_runtime, RedisServer};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::DecidedBy;
use tower_throttle::key::HeaderKey;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::store::FallbackStore;
use tower_throttle::store::Outage;
use tower_throttle::{FailMode, MemoryStore, Policy, Store, StoreError, ThrottleLayer};
use tracing::Level;

/// Generous: an outage is answered at once, and a slow machine must not
/// turn it into a timeout.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);
pub(crate) const LIMIT: u64 = 3;
pub(crate) const DAY: Duration = Duration::from_secs(86_400);

/// One policy per script path, each admitting `LIMIT` at once.
pub(crate) fn policies() -> Vec<(&'static str, Policy)> {
    vec![
        ("gcra", Policy::cell(LIMIT - 1, 1, DAY).unwrap()),
        ("fixed", Policy::fixed_window(LIMIT, DAY).unwrap()),
        ("sliding", Policy::sliding_window(LIMIT, DAY).unwrap()),
        ("log", Policy::sliding_log(LIMIT, DAY).unwrap()),
        ("concurrency", Policy::concurrency(LIMIT).unwrap()),
    ]
}

/// The fallbacks' store, on a clock that stands still: on the system clock
/// a day boundary mid-test would open a new fixed window and admit more.
pub(crate) fn fallback_memory() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

/// A batched and an unbatched store on `url` (no denial cache: every check
/// reaches Redis).
pub(crate) async fn stores(url: &str) -> [RedisStore; 2] {
    let store = |batching| async move {
        RedisStore::builder()
            .timeout(TIMEOUT)
            .deny_cache(0)
            .batching(batching)
            .connect(url)
            .await
            .unwrap()
    };
    [store(true).await, store(false).await]
}

/// The policies whose scripts' first write grows memory (`SET`, `INCRBY`),
/// which a server out of memory refuses. The sliding log's and the
/// concurrency limit's first write is a `ZREMRANGEBYSCORE` (never refused):
/// Redis then lets the rest of the script write past `maxmemory`, as for
/// any script that has written, so those checks are still decided by Redis.
fn growing_first() -> Vec<(&'static str, Policy)> {
    policies().into_iter().take(3).collect()
}

/// Every check of `store` under `ps` fails with `Unavailable(why)`, and so
/// does a two-rule check of `ps[1]` and `ps[2]`.
pub(crate) async fn assert_refused<C>(
    store: &RedisStore<C>,
    ps: &[(&'static str, Policy)],
    why: Outage,
    tag: &str,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut results = Vec::new();
    for (name, p) in ps {
        let key = format!("{tag}:{name}");
        results.push((*name, store.check(Charge::new(key.as_bytes(), p, 1)).await));
    }
    let (a, b) = (format!("{tag}:m1"), format!("{tag}:m2"));
    let both = [
        Charge::new(a.as_bytes(), &ps[1].1, 1),
        Charge::new(b.as_bytes(), &ps[2].1, 1),
    ];
    results.push((
        "two rules",
        store.check_all(&both).await.map(|mut d| d.remove(0)),
    ));
    for (name, r) in results {
        let e = r.expect_err(name);
        assert!(
            matches!(e, StoreError::Unavailable(got) if got == why) && e.is_unavailable(),
            "{tag} {name}: {e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("rate-limit store cannot decide now: {why}")
        );
    }
}

/// Through a `FallbackStore` asking Redis on every call, every check is
/// decided by the fallback, which admits each key its limit.
pub(crate) async fn assert_fallback_decides<C>(
    redis: RedisStore<C>,
    ps: &[(&'static str, Policy)],
    tag: &str,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let store = FallbackStore::new(redis, fallback_memory()).probe_interval(Duration::ZERO);
    for (name, p) in ps {
        let key = format!("{tag}:fb:{name}");
        let mut allowed = Vec::new();
        for _ in 0..LIMIT + 2 {
            let d = store.check(Charge::new(key.as_bytes(), p, 1)).await;
            let d = d.unwrap_or_else(|e| panic!("{tag} {name}: {e:?}"));
            assert_eq!(d.decided_by, DecidedBy::Fallback, "{tag} {name}");
            allowed.push(d.allowed);
        }
        assert_eq!(allowed, [true, true, true, false, false], "{tag} {name}");
    }
}

/// A fail-closed layer over a `FallbackStore`: no 503, each user gets the
/// limit and then 429s, every admission decided by the fallback.
pub(crate) async fn assert_layer_answers(redis: RedisStore, tag: &str) {
    let store = FallbackStore::new(redis, fallback_memory()).probe_interval(Duration::ZERO);
    let layer = ThrottleLayer::new(store, Policy::fixed_window(LIMIT, DAY).unwrap())
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .fail_mode(FailMode::Closed)
        .request_info(true);
    let svc = ServiceBuilder::new().layer(layer).service(handler());
    for user in 0..4 {
        let mut seen = Vec::new();
        for _ in 0..LIMIT + 3 {
            let req = Request::builder()
                .header("x-user", format!("{tag}-{user}"))
                .body(())
                .unwrap();
            let res = svc.clone().oneshot(req).await.unwrap();
            let by = res
                .headers()
                .get("x-decided-by")
                .map(|v| v.to_str().unwrap().to_owned());
            seen.push((res.status().as_u16(), by));
        }
        let fb = Some("fallback".to_owned());
        let mut want = vec![(200, fb); LIMIT as usize];
        want.extend([(429, None), (429, None), (429, None)]);
        assert_eq!(seen, want, "{tag}, user {user}");
    }
}

/// Once the state is over Redis decides again (the breaker may fail calls
/// at once for up to a store timeout after a busy or loading server).
pub(crate) async fn assert_recovers<C>(store: &RedisStore<C>, tag: &str)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let p = Policy::fixed_window(LIMIT, DAY).unwrap();
    let key = format!("{tag}:back");
    let deadline = Instant::now() + DEADLINE;
    loop {
        match store.check(Charge::new(key.as_bytes(), &p, 1)).await {
            Ok(d) => {
                assert!(
                    d.allowed && d.decided_by == DecidedBy::Primary,
                    "{tag}: {d:?}"
                );
                return;
            }
            Err(e) if e.is_unavailable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("{tag}: Redis does not decide again: {e:?}"),
        }
    }
}

/// Everything an outage must hold for the checks under `ps`, on both
/// stores, then the fallback and the layer on the first.
pub(crate) async fn assert_outage(
    stores: &[RedisStore; 2],
    ps: &[(&'static str, Policy)],
    why: Outage,
    tag: &str,
) {
    for (i, store) in stores.iter().enumerate() {
        assert_refused(store, ps, why, &format!("{tag}{i}")).await;
    }
    assert_fallback_decides(stores[0].clone(), ps, tag).await;
    assert_layer_answers(stores[0].clone(), tag).await;
    assert_eq!(
        Capture::install().count(Level::ERROR, why_code(why)),
        0,
        "{tag}: an outage logged as a defect"
    );
}

/// A server started with `args`, a runtime, and both stores on the server.
pub(crate) fn started(args: &[String]) -> (RedisServer, tokio::runtime::Runtime, [RedisStore; 2]) {
    Capture::install();
    let server = RedisServer::start_with_args(args);
    let rt = current_thread_runtime();
    let stores = rt.block_on(stores(&server.url()));
    (server, rt, stores)
}

pub(crate) fn why_code(why: Outage) -> &'static str {
    match why {
        Outage::OutOfMemory => "OOM",
        Outage::Busy => "BUSY",
        Outage::Loading => "LOADING",
        Outage::ReadOnly => "READONLY",
        Outage::MasterDown => "MASTERDOWN",
        Outage::PersistenceFailing => "MISCONF",
        Outage::NoReplicas => "NOREPLICAS",
        Outage::TooManyClients => "max number of clients",
        Outage::AuthRequired => "NOAUTH",
        Outage::AuthRefused => "WRONGPASS",
        _ => "NOSCRIPT",
    }
}

#[test]
fn a_server_out_of_memory_is_an_outage() {
    let (server, rt, stores) = started(&small_noeviction());
    fill_until_oom(&server);
    rt.block_on(async {
        assert_outage(&stores, &growing_first(), Outage::OutOfMemory, "oom").await;
        // The others are decided by Redis (see growing_first).
        for (name, p) in &policies()[3..] {
            let key = format!("oom:{name}");
            let d = stores[0].check(Charge::new(key.as_bytes(), p, 1)).await;
            let d = d.unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert!(d.allowed && d.decided_by == DecidedBy::Primary, "{name}");
        }
        let _: () = redis::cmd("FLUSHALL").query(&mut server.conn()).unwrap();
        assert_recovers(&stores[0], "oom").await;
    });
}

#[test]
fn a_server_busy_with_another_script_is_an_outage_and_is_not_hammered() {
    let (server, rt, stores) = started(&busy_threshold());
    let busy = BusyScript::start(&server);
    rt.block_on(assert_outage(&stores, &policies(), Outage::Busy, "busy"));
    busy.stop(&server);
    // The breaker: after the first BUSY each store sent no check, only
    // PINGs, until the server answered again.
    let rejected = rejected_calls(&server, "evalsha");
    assert!(rejected <= 2, "{rejected} EVALSHA sent to the busy server");
    rt.block_on(assert_recovers(&stores[0], "busy"));
}

#[test]
fn a_loading_server_is_an_outage() {
    let (server, rt, stores) = started(&debug_enabled());
    let loading = Loading::start(&server);
    rt.block_on(assert_outage(
        &stores,
        &policies(),
        Outage::Loading,
        "loading",
    ));
    assert_eq!(
        ping_code(&server).as_deref(),
        Some("LOADING"),
        "loaded too soon"
    );
    loading.finish(&server);
    rt.block_on(assert_recovers(&stores[0], "loading"));
}

#[test]
fn a_replica_and_a_demoted_master_are_outages() {
    Capture::install();
    let master = RedisServer::start();
    let replica_args = ["--replicaof", "127.0.0.1", &master.port.to_string()].map(String::from);
    let replica = RedisServer::start_with_args(&replica_args);
    wait_link_up(&replica);
    let rt = current_thread_runtime();
    let on_replica = rt.block_on(stores(&replica.url()));
    let on_master = rt.block_on(stores(&master.url()));
    rt.block_on(assert_outage(
        &on_replica,
        &policies(),
        Outage::ReadOnly,
        "replica",
    ));
    // A failover: the replica promoted, the master demoted under its store.
    replica_of(&replica, None);
    replica_of(&master, Some(replica.port));
    wait_link_up(&master);
    rt.block_on(assert_outage(
        &on_master,
        &policies(),
        Outage::ReadOnly,
        "demoted",
    ));
    rt.block_on(assert_recovers(&on_replica[0], "promoted"));
}

#[test]
fn a_replica_without_its_master_is_an_outage() {
    let (server, rt, stores) = started(&[]);
    lose_master(&server);
    rt.block_on(assert_outage(
        &stores,
        &policies(),
        Outage::MasterDown,
        "masterdown",
    ));
    replica_of(&server, None);
    rt.block_on(assert_recovers(&stores[0], "masterdown"));
}

#[test]
fn scripts_a_reload_cannot_bring_back_are_an_outage() {
    Capture::install();
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        // Flushed once (a restart, SCRIPT FLUSH): reloaded, Redis decides.
        let plain = RedisStore::connect(server.url()).await.unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut server.conn())
            .unwrap();
        assert_recovers(&plain, "flushed once").await;
        // Flushed before every call: NOSCRIPT after the reload too.
        let store = meddled(&server, None, TIMEOUT).await;
        assert_refused(&store, &policies(), Outage::ScriptsLost, "noscript").await;
        let flushes = *store.connection().flushes.lock().unwrap();
        assert!(
            flushes >= 2 * 6,
            "loaded again and retried: {flushes} flushes"
        );
        assert_fallback_decides(store, &policies(), "noscript").await;
    });
}

#[test]
fn replies_the_crate_does_not_understand_are_defects_logged_once() {
    Capture::install();
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let cases = [
            ("local t = nil return t.x", "attempt to index"),
            ("return 'a surprise'", "expected an array"),
        ];
        for (lua, says) in cases {
            let store = meddled(&server, Some(lua), TIMEOUT).await;
            let fallback = FallbackStore::new(store, MemoryStore::new());
            let p = Policy::fixed_window(LIMIT, DAY).unwrap();
            for i in 0..20 {
                let key = format!("defect:{i}");
                let e = fallback
                    .check(Charge::new(key.as_bytes(), &p, 1))
                    .await
                    .expect_err("a defect is not hidden by the fallback");
                assert!(!e.is_unavailable(), "{e:?}");
                assert!(
                    matches!(e, StoreError::Script(_) | StoreError::Protocol(_)),
                    "{e:?}"
                );
                assert!(e.to_string().contains(says), "{e}");
            }
            assert!(!fallback.is_on_fallback());
            assert_eq!(
                Capture::install().count(Level::ERROR, says),
                1,
                "{says}: logged once, not per call"
            );
        }
    });
}
