//! Starting without Redis on a cluster (`connect_cluster_lazy`) and behind
//! Sentinel (`connect_sentinel_lazy`), and on a server at `maxclients`:
//! the app's store is built while nothing listens on the ports it names, a
//! `FallbackStore` decides, then the real cluster (resp. sentinel, then
//! master) starts on those ports and the checks land in Redis, read back by
//! another store. States the servers pass through on the way (a cluster
//! not formed yet, a master the sentinel sees down, a server refusing new
//! connections) are waited for, never logged as a setup error.

use std::time::Duration;

use http::StatusCode;
use redis_support::{free_port, runtime, RedisCluster, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::DecidedBy;
use tower_throttle::store::redis::TimeSource;
use tower_throttle::store::{Charge, FallbackStore, RedisStore};
use tower_throttle::{MemoryStore, Store};
use tracing::Level;

use crate::capture::Capture;
use crate::redis_lazy::*;
use crate::redis_support;
use crate::sentinel::Sentinel;

const MASTER: &str = "lazymaster";

/// What the lazy store logs when a server refuses its setup.
const REFUSED: &str = "refuses this rate-limit store's setup";

/// `n` distinct free ports, each with its cluster bus port free too.
fn free_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::new();
    for _ in 0..100 {
        let p = free_port(true);
        if !ports.contains(&p) {
            ports.push(p);
        }
        if ports.len() == n {
            return ports;
        }
    }
    panic!("no {n} distinct free ports");
}

/// Redis decides on a frozen clock: on the server's, a day boundary
/// mid-test would split its count over two fixed windows.
fn frozen() -> TimeSource {
    TimeSource::client(ManualClock::new())
}

#[test]
fn a_cluster_store_starts_before_the_cluster_and_moves_to_it() {
    let capture = Capture::install();
    let ports = free_ports(3);
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect();
    let addr = format!("addr=127.0.0.1:{},", ports[0]);
    runtime().block_on(async {
        let primary = RedisStore::builder()
            .prefix("lazy")
            .timeout(Duration::from_millis(200))
            .time_source(frozen())
            .connect_cluster_lazy(urls)
            .unwrap();
        let store = FallbackStore::new(primary.clone(), MemoryStore::new());
        let svc = service(store.clone());
        on_fallback_until(&svc, "a failure logged", || {
            capture.count_all(Level::WARN, &["cannot reach Redis", &addr]) > 0
        })
        .await;
        assert!(!primary.is_connected());

        let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_on(&ports))
            .await
            .unwrap();
        until_redis_decides(&svc).await;
        assert_eq!(
            request(&svc).await,
            (StatusCode::OK, Some(DecidedBy::Primary))
        );
        assert!(primary.is_connected() && !store.is_on_fallback());

        // The two admissions Redis decided are in the cluster.
        let other = RedisStore::builder()
            .prefix("lazy")
            .time_source(frozen())
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        let p = policy();
        let peek = other.check(Charge::new(b"up:n:u", &p, 0)).await.unwrap();
        assert_eq!(LIMIT - peek.remaining, 2);
    });
    assert_eq!(
        capture.count_all(Level::ERROR, &[REFUSED, &addr]),
        0,
        "a cluster on its way up is no setup error:\n{}",
        capture.dump()
    );
    assert_eq!(
        capture.count_all(Level::WARN, &["connected to Redis at last", &addr]),
        1
    );
}

#[test]
fn a_sentinel_store_starts_before_the_sentinel_and_waits_for_the_master() {
    let capture = Capture::install();
    let ports = free_ports(2);
    let (sentinel_port, master_port) = (ports[0], ports[1]);
    let url = format!("redis://127.0.0.1:{sentinel_port}/");
    let addr = format!("addr={MASTER} via sentinels 127.0.0.1:{sentinel_port} ");
    runtime().block_on(async {
        let primary = RedisStore::builder()
            .prefix("lazy")
            .timeout(Duration::from_millis(200))
            .time_source(frozen())
            .sentinel_poll_interval(Duration::from_millis(100))
            .connect_sentinel_lazy([url], MASTER)
            .unwrap();
        let store = FallbackStore::new(primary.clone(), MemoryStore::new());
        let svc = service(store.clone());
        // Nothing listens.
        on_fallback_until(&svc, "a failure logged", || {
            capture.count_all(Level::WARN, &["cannot reach Redis", &addr]) > 0
        })
        .await;

        // The sentinel up, its master not: it flags it down, and attempts
        // meanwhile find no master to connect to, which passes.
        let sentinel = tokio::task::spawn_blocking(move || {
            Sentinel::start_on(sentinel_port, MASTER, master_port)
        })
        .await
        .unwrap();
        on_fallback_until(&svc, "the master flagged down", || {
            sentinel
                .master_flags(MASTER)
                .is_some_and(|f| f.contains("s_down"))
        })
        .await;
        // An attempt opens two connections to the sentinel (asking for the
        // master, then whether it knows the name): at least one more
        // attempt after the flag.
        let mut admin = sentinel.conn().expect("the sentinel answers");
        let seen = connections(&mut admin);
        on_fallback_until(&svc, "another attempt", || {
            connections(&mut admin) >= seen + 4
        })
        .await;
        assert_eq!(
            capture.count_all(Level::ERROR, &[REFUSED, &addr]),
            0,
            "a master the sentinels see down is no setup error:\n{}",
            capture.dump()
        );
        assert!(!primary.is_connected());

        // The master starts: the sentinel sees it up, Redis decides.
        let master = tokio::task::spawn_blocking(move || RedisServer::start_on(master_port, &[]))
            .await
            .unwrap();
        until_redis_decides(&svc).await;
        assert_eq!(
            request(&svc).await,
            (StatusCode::OK, Some(DecidedBy::Primary))
        );
        assert!(primary.is_connected() && !store.is_on_fallback());

        // The two admissions Redis decided are on the master.
        let other = RedisStore::builder()
            .prefix("lazy")
            .time_source(frozen())
            .connect(master.url())
            .await
            .unwrap();
        let p = policy();
        let peek = other.check(Charge::new(b"up:n:u", &p, 0)).await.unwrap();
        assert_eq!(LIMIT - peek.remaining, 2);
    });
    assert_eq!(
        capture.count_all(Level::WARN, &["connected to Redis at last", &addr]),
        1
    );
}

/// `INFO stats`' `rejected_connections` (refused at `maxclients`), through
/// `admin`.
fn rejected(admin: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(admin).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("rejected_connections:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[test]
fn a_server_at_maxclients_is_waited_for_not_reported_as_a_setup_error() {
    let capture = Capture::install();
    let server = RedisServer::start();
    let addr = format!("addr=127.0.0.1:{} ", server.port);
    let mut admin = server.conn();
    let max_clients = |admin: &mut redis::Connection, n: u32| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxclients")
            .arg(n)
            .query(admin)
            .unwrap();
    };
    // Only `admin` is let in.
    max_clients(&mut admin, 1);
    runtime().block_on(async {
        let store = FallbackStore::new(lazy(&server.url()), MemoryStore::new());
        let svc = service(store);
        on_fallback_until(&svc, "a failure logged", || {
            capture.count_all(Level::WARN, &["cannot reach Redis", &addr]) > 0
        })
        .await;
        // One attempt tries up to three connections (the first and two
        // retries): four more refused are at least one more attempt.
        let before = rejected(&mut admin);
        on_fallback_until(&svc, "another attempt refused", || {
            rejected(&mut admin) >= before + 4
        })
        .await;
        assert_eq!(
            capture.count_all(Level::ERROR, &[&addr]),
            0,
            "{}",
            capture.dump()
        );
        max_clients(&mut admin, 10_000);
        until_redis_decides(&svc).await;
    });
}
