//! Reconnects after a restart, scripts reloaded after `SCRIPT FLUSH`, typed errors.

use crate::redis_support;

use std::time::{Duration, Instant};

use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store, StoreError};

// --------------------------------------------------------------- failures ---

#[test]
fn reconnects_after_the_server_restarts() {
    let mut server = RedisServer::start();
    runtime().block_on(async {
        let timeout = Duration::from_millis(300);
        let store = RedisStore::builder()
            .timeout(timeout)
            .connect(server.url())
            .await
            .unwrap();
        let p = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
        let rule = Charge::new(b"k", &p, 1);
        assert!(store.check(rule).await.unwrap().allowed);

        server.stop();
        for _ in 0..3 {
            let t0 = Instant::now();
            let err = store.check(rule).await.unwrap_err();
            assert!(
                matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
                "{err:?}"
            );
            assert!(t0.elapsed() < timeout * 3, "answered in {:?}", t0.elapsed());
        }

        server.start_again();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match store.check(rule).await {
                Ok(d) => {
                    // The restarted server lost the state (no persistence).
                    assert_eq!(d.remaining, 99);
                    break;
                }
                Err(StoreError::Connection(_) | StoreError::Timeout(_))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("no recovery: {e:?}"),
            }
        }
    });
}

#[test]
fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        let p = Policy::sliding_log(5, Duration::from_secs(60)).unwrap();
        assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(
            store
                .check(Charge::new(b"k", &p, 1))
                .await
                .unwrap()
                .remaining,
            3
        );
    });
}

#[test]
fn errors_are_typed() {
    runtime().block_on(async {
        connecting_to_nothing_is_typed().await;
        connecting_to_a_silent_server_times_out().await;
        a_prefix_with_braces_is_refused().await;
    });
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        policies_out_of_range_are_unsupported(&store).await;
        keys_of_another_type_are_typed_and_repaired(&server, &store).await;
    });
}

async fn connecting_to_nothing_is_typed() {
    // Nothing listens: connection refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisStore::connect(format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
        "{err:?}"
    );
}

/// Something accepts but never answers: the store timeout.
async fn connecting_to_a_silent_server_times_out() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let (sock, _) = silent.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(sock);
    });
    let t0 = Instant::now();
    let err = RedisStore::builder()
        .timeout(Duration::from_millis(200))
        .connect(url)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Timeout(_) | StoreError::Connection(_)),
        "{err:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    held.join().unwrap();
}

async fn a_prefix_with_braces_is_refused() {
    let bad_prefix = RedisStore::builder()
        .prefix("a{b}")
        .connect("redis://127.0.0.1:1/")
        .await;
    assert!(matches!(bad_prefix, Err(StoreError::InvalidRequest(_))));
}

async fn policies_out_of_range_are_unsupported(store: &RedisStore) {
    // Beyond 2^50 µs or a count of 2^50: refused; a window under a µs
    // and a sliding window's products past 2^53 run.
    for p in [
        Policy::fixed_window(1, Duration::from_micros((1 << 50) + 1)).unwrap(),
        Policy::sliding_window((1 << 50) + 1, Duration::from_secs(3600)).unwrap(),
    ] {
        let err = store.check(Charge::new(b"k", &p, 1)).await.unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    }
    for p in [
        Policy::fixed_window(1, Duration::from_nanos(999)).unwrap(),
        Policy::sliding_window(1 << 40, Duration::from_secs(3600)).unwrap(),
    ] {
        assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
    }
}

async fn keys_of_another_type_are_typed_and_repaired(server: &RedisServer, store: &RedisStore) {
    // A key of another type under a GCRA name: a typed error naming
    // the key, which is repaired (deleted): the next check is fresh.
    let p = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
    let key = store.redis_key(b"clobbered", &p);
    let _: () = redis::cmd("LPUSH")
        .arg(&key)
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let err = store
        .check(Charge::new(b"clobbered", &p, 1))
        .await
        .unwrap_err();
    let StoreError::ForeignData { key: named, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(named.as_bytes(), &key[..]);
    let d = store.check(Charge::new(b"clobbered", &p, 1)).await.unwrap();
    assert_eq!(d.to_cell_reply(), [0, 2, 1, -1, 1]);
    // Every other algorithm likewise.
    let p = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
    let key = store.redis_key(b"clobbered", &p);
    let _: () = redis::cmd("LPUSH")
        .arg(&key)
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    let err = store
        .check(Charge::new(b"clobbered", &p, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::ForeignData { .. }), "{err:?}");
    assert!(
        store
            .check(Charge::new(b"clobbered", &p, 1))
            .await
            .unwrap()
            .allowed
    );
}
