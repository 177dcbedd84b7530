//! The refusals a review of every error reply of Redis 7 and Valkey added
//! to the outages (the table is in the Redis store's docs, "Which server
//! errors fall back"), each on a real `redis-server` put into that state: a
//! server that cannot persist (`MISCONF`), a master without the replicas
//! `min-replicas-to-write` asks for (`NOREPLICAS`), a server at
//! `maxclients` refusing the store's new connection, and a server restarted
//! with a password the store lacks (`NOAUTH`) or with another one
//! (`WRONGPASS`). Each fails the store's checks with
//! `StoreError::Unavailable` naming the state (at `maxclients`, on
//! loopback, the refusal reaches redis-rs as a reset connection), a
//! `FallbackStore` decides meanwhile, and Redis decides again once the
//! state ends. Before the review each was a defect or a setup error: no
//! fallback, every check failed.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::{Charge, Outage};
use tower_throttle::{Policy, Store, StoreError};
use tracing::Level;

use crate::capture::Capture;
use crate::outages::*;
use crate::redis_outages::*;
use crate::redis_support::{current_thread_runtime, RedisServer};

#[test]
fn a_server_that_cannot_persist_is_an_outage() {
    let (server, rt, stores) = started(&dir_settable());
    let saves = FailingSaves::start(&server);
    // The server refuses every write, and PING.
    assert_eq!(ping_code(&server).as_deref(), Some("MISCONF"));
    rt.block_on(assert_outage(
        &stores,
        &policies(),
        Outage::PersistenceFailing,
        "misconf",
    ));
    saves.fix(&server);
    rt.block_on(assert_recovers(&stores[0], "misconf"));
}

#[test]
fn a_master_without_the_replicas_it_requires_is_an_outage() {
    let (master, rt, stores) = started(&[]);
    config_set(&master, "min-replicas-to-write", "1");
    rt.block_on(assert_outage(
        &stores,
        &policies(),
        Outage::NoReplicas,
        "noreplicas",
    ));
    // A replica attaches: the master counts it (once a second) and writes.
    let args = ["--replicaof", "127.0.0.1", &master.port.to_string()].map(String::from);
    let replica = RedisServer::start_with_args(&args);
    wait_link_up(&replica);
    rt.block_on(assert_recovers(&stores[0], "noreplicas"));
}

/// `CONFIG SET maxclients <n>` through `admin`, a connection kept open
/// (a new one may be refused).
fn max_clients(admin: &mut redis::Connection, n: u32) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(n)
        .query(admin)
        .expect("CONFIG SET maxclients");
}

#[test]
fn a_server_at_maxclients_refusing_new_connections_is_an_outage() {
    let (server, rt, stores) = started(&[]);
    let mut admin = server.conn();
    // Only `admin` stays: the stores' connections are cut, and every new
    // one (their reconnects, another store's connect) is refused.
    max_clients(&mut admin, 1);
    let killed: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut admin)
        .expect("CLIENT KILL");
    assert!(killed >= 2, "{killed} connections cut");
    rt.block_on(async {
        let connecting = RedisStore::builder()
            .timeout(TIMEOUT)
            .connect(server.url())
            .await;
        // Unavailable, not a setup error: on loopback redis-rs meets the
        // refusal as a reset connection (its setup commands race the
        // server's close), over a network often as the reply itself.
        assert!(
            connecting.as_ref().is_err_and(StoreError::is_unavailable),
            "{connecting:?}"
        );
        for (i, store) in stores.iter().enumerate() {
            let tag = format!("maxclients:{i}");
            assert_fallback_decides(store.clone(), &policies(), &tag).await;
        }
    });
    assert_eq!(
        Capture::install().count(Level::ERROR, "max number of clients"),
        0,
        "an outage logged as a defect"
    );
    max_clients(&mut admin, 10_000);
    for store in &stores {
        rt.block_on(assert_recovers(store, "maxclients"));
    }
}

#[test]
fn a_restart_with_a_password_the_store_lacks_is_an_outage_logged_as_an_error() {
    let capture = Capture::install();
    let mut server = RedisServer::start();
    let rt = current_thread_runtime();
    let stores = rt.block_on(stores(&server.url()));
    server.restart_with_password(Some("rotated"));
    rt.block_on(async {
        for (i, store) in stores.iter().enumerate() {
            until_refused(store, Outage::AuthRequired, &format!("noauth{i}")).await;
        }
        assert_fallback_decides(stores[0].clone(), &policies(), "noauth").await;
        assert_layer_answers(stores[1].clone(), "noauth").await;
    });
    let logged = ["credentials", "requires a password"];
    assert_eq!(
        capture.count_all(Level::ERROR, &logged),
        1,
        "logged once a minute at most:\n{}",
        capture.dump()
    );
    assert_eq!(capture.count_all(Level::ERROR, &["rotated"]), 0);
    // The server restarted as before: Redis decides (the scripts reloaded).
    server.restart_with_password(None);
    rt.block_on(assert_recovers(&stores[0], "noauth"));
}

#[test]
fn a_restart_with_another_password_is_an_outage_logged_as_an_error() {
    let capture = Capture::install();
    let mut server = RedisServer::start_with_password("before", &[]);
    let rt = current_thread_runtime();
    let stores = rt.block_on(stores(&server.url_as("default", "before")));
    server.restart_with_password(Some("after"));
    rt.block_on(async {
        for (i, store) in stores.iter().enumerate() {
            until_refused(store, Outage::AuthRefused, &format!("wrongpass{i}")).await;
        }
        assert_fallback_decides(stores[0].clone(), &policies(), "wrongpass").await;
        assert_layer_answers(stores[1].clone(), "wrongpass").await;
    });
    let logged = ["credentials", "refused the credentials"];
    assert_eq!(
        capture.count_all(Level::ERROR, &logged),
        1,
        "{}",
        capture.dump()
    );
    for password in ["before", "after"] {
        assert_eq!(capture.count_all(Level::ERROR, &[password]), 0);
    }
    // No recovery asserted: redis-rs's ConnectionManager does not retry a
    // reconnect that failed on anything but an I/O error, so a store whose
    // reconnect was refused its credentials stays refused (on the fallback)
    // until the app reconnects it, even once the server takes them again.
}

/// Checks until one fails with `Unavailable(why)`, within [`DEADLINE`]:
/// the calls right after the server's restart or a cut connection may fail
/// as a broken connection first. Anything else fails the test.
async fn until_refused<C>(store: &RedisStore<C>, why: Outage, tag: &str)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let p = Policy::fixed_window(LIMIT, DAY).unwrap();
    let key = format!("{tag}:refused");
    let deadline = Instant::now() + DEADLINE;
    loop {
        match store.check(Charge::new(key.as_bytes(), &p, 1)).await {
            Err(StoreError::Unavailable(got)) if got == why => return,
            Err(StoreError::Connection(_) | StoreError::Timeout(_))
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("{tag}: expected Unavailable({why:?}), got {other:?}"),
        }
    }
}
