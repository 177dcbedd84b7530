//! Foreign data at the crate's Redis keys: values another program wrote.
//! A check finding one — under any algorithm — fails alone with a typed
//! error naming the key, the key is deleted, and the next check finds it
//! fresh: nobody stays locked out (a "1e30" read as a tat, a window index
//! or a score would deny forever).

use crate::redis_support;

use std::time::{Duration, Instant};

use redis::ConnectionLike;
use redis_support::{current_thread_runtime as runtime, RedisCluster, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::Receipt;
use tower_throttle::policy::Algorithm;
use tower_throttle::store::redis::{HashTag, RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store, StoreError};

#[test]
fn foreign_values_at_gcra_keys_are_typed_errors_then_fresh() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        let whole = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let thirds = Policy::token_bucket(2, 3.0).unwrap(); // T = 333,333,333 ns
        let mut conn = server.conn();
        for (i, p) in [whole, thirds].iter().enumerate() {
            for (j, value) in ["1e30", "-5", "abc", "1.5", "99999999999999999"]
                .into_iter()
                .enumerate()
            {
                let user = format!("u{i}-{j}");
                let key = store.redis_key(user.as_bytes(), p);
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(value)
                    .query(&mut conn)
                    .unwrap();
                let err = store
                    .check(Charge::new(user.as_bytes(), p, 1))
                    .await
                    .unwrap_err();
                let StoreError::ForeignData { key: named, .. } = &err else {
                    panic!("{value}: {err:?}")
                };
                assert_eq!(named.as_bytes(), &key[..], "{value}");
                assert!(err.to_string().contains("another program"), "{err}");
                // Repaired: a fresh key admits its whole burst.
                let sent = Instant::now();
                for _ in 0..2 {
                    let d = store
                        .check(Charge::new(user.as_bytes(), p, 1))
                        .await
                        .unwrap();
                    assert!(d.allowed, "{value}: {d:?}");
                }
                let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
                // On the server's clock the key outlives its last write by
                // at least T (1/3 s here), not by what a stalled machine may
                // take before this read: gone then (-2), never unexpiring.
                let outlived = ttl == -2 && sent.elapsed() >= Duration::from_millis(300);
                assert!(outlived || (ttl > 0 && ttl <= 3_000), "{value}: {ttl}");
            }
        }
    });
}

/// The test clock's `now`, in µs (the frozen client clock).
const NOW_NS: u64 = 1_700_000_000_000_000_000;
/// A time 10 s after `now`, in µs: a valid time, but in the future.
const SOON: &str = "1700000010000000";

/// One way another program can write at a key: commands, `K` standing for
/// the key, and whether it is foreign data (else it is state this crate
/// could have written, which must be used, not deleted).
struct Plant {
    cmds: &'static [&'static [&'static str]],
    foreign: bool,
}

const fn bad(cmds: &'static [&'static [&'static str]]) -> Plant {
    Plant {
        cmds,
        foreign: true,
    }
}

const fn good(cmds: &'static [&'static [&'static str]]) -> Plant {
    Plant {
        cmds,
        foreign: false,
    }
}

/// Data of another Redis type, for every algorithm.
const OTHER_TYPES: &[Plant] = &[
    bad(&[&["LPUSH", "K", "x"]]),
    bad(&[&["HSET", "K", "f", "v"]]),
    bad(&[&["SADD", "K", "m"]]),
];

/// Strings at a window's key (fixed "<index>:<count>" or packed, sliding
/// "<index>:<current>:<previous>"); index 99999999 is after `now`'s window
/// for every window below 19 days.
const FIXED: &[Plant] = &[
    bad(&[&["ZADD", "K", "1", "m"]]),
    bad(&[&["SET", "K", "1e30"]]),
    bad(&[&["SET", "K", "-5"]]),
    bad(&[&["SET", "K", "abc"]]),
    bad(&[&["SET", "K", "1.5"]]),
    bad(&[&["SET", "K", "1:1e30"]]),
    bad(&[&["SET", "K", "1:-5"]]),
    bad(&[&["SET", "K", "1:1.5"]]),
    bad(&[&["SET", "K", "1:9999999999999999"]]),
    bad(&[&["SET", "K", "99999999999999999:1"]]),
    bad(&[&["SET", "K", "1:2:3"]]),
    // A window after now's that would never expire.
    bad(&[&["SET", "K", "99999999:3"]]),
    // The same with an expiry: a clock that went back (this crate's own).
    good(&[&["SET", "K", "99999999:3", "PX", "60000"]]),
    good(&[&["SET", "K", "1:3"]]),
    // Packed as index·2^20 + count: window 99999999, count 3, with and
    // without an expiry; window 1, count 3; and 2^53, past the packed form.
    bad(&[&["SET", "K", "104857598951427"]]),
    good(&[&["SET", "K", "104857598951427", "PX", "60000"]]),
    good(&[&["SET", "K", "1048579"]]),
    bad(&[&["SET", "K", "9007199254740992"]]),
];

const SLIDING: &[Plant] = &[
    bad(&[&["ZADD", "K", "1", "m"]]),
    bad(&[&["SET", "K", "1e30"]]),
    bad(&[&["SET", "K", "abc"]]),
    bad(&[&["SET", "K", "1:2"]]),
    bad(&[&["SET", "K", "1:2:3:4"]]),
    bad(&[&["SET", "K", "1:-1:0"]]),
    bad(&[&["SET", "K", "1:1.5:0"]]),
    bad(&[&["SET", "K", "1:0:9999999999999999"]]),
    bad(&[&["SET", "K", "1e30:0:0"]]),
    bad(&[&["SET", "K", "99999999:3:0"]]),
    good(&[&["SET", "K", "99999999:3:0", "PX", "60000"]]),
    good(&[&["SET", "K", "1:3:3"]]),
];

/// Sorted sets at a log's key: scores are times in µs.
const LOG: &[Plant] = &[
    bad(&[&["SET", "K", "abc"]]),
    bad(&[&["ZADD", "K", "inf", "a"]]),
    bad(&[&["ZADD", "K", "1e30", "a"]]),
    bad(&[&["ZADD", "K", "1700000000000000.5", "a"]]),
    bad(&[&["ZADD", "K", "1700000000000000", "a", "1e30", "b"]]),
    // Units after now that would never leave.
    bad(&[&["ZADD", "K", SOON, "a", SOON, "b", SOON, "c"]]),
    good(&[
        &["ZADD", "K", SOON, "a", SOON, "b", SOON, "c"],
        &["PEXPIRE", "K", "60000"],
    ]),
    // Times long past are pruned, whatever the members.
    good(&[&["ZADD", "K", "-5", "a", "1", "b"]]),
];

/// Sorted sets at a lease key: "<seq>:<permit>:<units>[:<ns>]" by expiry.
const LEASES: &[Plant] = &[
    bad(&[&["SET", "K", "abc"]]),
    bad(&[&["ZADD", "K", "inf", "1:1:1"]]),
    bad(&[&["ZADD", "K", "1e30", "1:1:1"]]),
    bad(&[&["ZADD", "K", "1700000000000000.5", "1:1:1"]]),
    bad(&[&["ZADD", "K", SOON, "junk"]]),
    bad(&[&["ZADD", "K", SOON, "1:1:1.5"]]),
    bad(&[&["ZADD", "K", SOON, "1:1:1:1234"]]),
    bad(&[&["ZADD", "K", SOON, "1:1:99999999999999999"]]),
    bad(&[&["ZADD", "K", SOON, "-1:1:1"]]),
    // Leases that deny and would never lapse.
    bad(&[&["ZADD", "K", SOON, "1:1:5"]]),
    good(&[&["ZADD", "K", SOON, "1:1:5"], &["PEXPIRE", "K", "60000"]]),
    good(&[&["ZADD", "K", "1", "1:1:5"]]),
];

/// Every algorithm, with a window (lease) in whole µs and one that is not,
/// and the foreign data planted at its keys.
fn cases() -> Vec<(Policy, Vec<&'static Plant>)> {
    let minute = Duration::from_secs(60);
    let odd = minute + Duration::from_nanos(1);
    let with = |own: &'static [Plant]| OTHER_TYPES.iter().chain(own).collect::<Vec<_>>();
    let mut out = Vec::new();
    for w in [minute, odd] {
        out.push((Policy::fixed_window(3, w).unwrap(), with(FIXED)));
        out.push((Policy::sliding_window(3, w).unwrap(), with(SLIDING)));
        out.push((Policy::sliding_log(3, w).unwrap(), with(LOG)));
        out.push((Policy::concurrency_with_lease(2, w).unwrap(), with(LEASES)));
    }
    out
}

fn plant(conn: &mut dyn ConnectionLike, key: &[u8], p: &Plant) {
    let _: () = redis::cmd("DEL").arg(key).query(conn).unwrap();
    for cmd in p.cmds {
        let mut c = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            if *a == "K" {
                c.arg(key);
            } else {
                c.arg(*a);
            }
        }
        let _: redis::Value = c.query(conn).unwrap();
    }
}

fn expect_foreign<T: std::fmt::Debug>(r: Result<T, StoreError>, key: &[u8], what: &str) {
    let Err(err) = r else { panic!("{what}: {r:?}") };
    let StoreError::ForeignData { key: named, .. } = &err else {
        panic!("{what}: {err:?}")
    };
    assert_eq!(named.as_bytes(), key, "{what}");
    assert!(err.to_string().contains("another program"), "{err}");
}

/// Every case against `store`: a foreign plant is one typed error, then
/// the key is fresh (and expires); a valid one is state, used as is.
async fn every_algorithm<C>(store: &RedisStore<C>, conn: &mut dyn ConnectionLike, label: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    for (i, (policy, plants)) in cases().into_iter().enumerate() {
        for (j, p) in plants.into_iter().enumerate() {
            let user = format!("{label}-{i}-{j}");
            let user = user.as_bytes();
            let key = store.redis_key(user, &policy);
            let what = format!("{label}: {policy:?} after {:?}", p.cmds);
            plant(conn, &key, p);
            let r = store.check(Charge::new(user, &policy, 1)).await;
            if !p.foreign {
                assert!(r.is_ok(), "{what}: {r:?}");
                continue;
            }
            expect_foreign(r, &key, &what);
            // Deleted; a lease key may hold the tombstone of the failed
            // check's permit (abandoned permits are released), with an expiry.
            let exists: u64 = redis::cmd("EXISTS").arg(&key).query(conn).unwrap();
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).unwrap();
            let lease = matches!(policy.algorithm(), Algorithm::Concurrency(_));
            assert!(exists == 0 || (lease && ttl > 0), "{what}: not deleted");
            // Fresh: the whole limit is there again.
            for n in 0..policy.limit() {
                let d = store.check(Charge::new(user, &policy, 1)).await.unwrap();
                assert!(d.allowed, "{what}: check {n}: {d:?}");
            }
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).unwrap();
            // At most two windows (a sliding window keeps the previous one).
            assert!(ttl > 0 && ttl <= 121_000, "{what}: {ttl}");
            // A refund finding foreign data: the same typed error, repaired.
            plant(conn, &key, p);
            let receipt = Receipt::new(1, 0, None);
            expect_foreign(store.refund(user, &policy, &receipt).await, &key, &what);
            assert!(
                store
                    .check(Charge::new(user, &policy, 1))
                    .await
                    .unwrap()
                    .allowed
            );
        }
    }
}

/// A multi-rule check one of whose keys is foreign fails whole and charges
/// none of the others; the next one is fresh.
async fn all_or_nothing<C>(store: &RedisStore<C>, conn: &mut dyn ConnectionLike, label: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let minute = Duration::from_secs(60);
    let fixed = Policy::fixed_window(1, minute).unwrap();
    let log = Policy::sliding_log(1, minute).unwrap();
    let lease = Policy::concurrency_with_lease(1, minute).unwrap();
    for (n, clobbered) in [&fixed, &log, &lease].into_iter().enumerate() {
        // One user's keys, one slot (HashTag::AfterFirst).
        let users = ["a", "b", "c"].map(|r| format!("{r}:{label}-multi-{n}"));
        let key = store.redis_key(users[n].as_bytes(), clobbered);
        plant(conn, &key, &OTHER_TYPES[0]);
        let rules = [
            Charge::new(users[0].as_bytes(), &fixed, 1),
            Charge::new(users[1].as_bytes(), &log, 1),
            Charge::new(users[2].as_bytes(), &lease, 1),
        ];
        expect_foreign(store.check_all(&rules).await, &key, label);
        // Nothing was charged: every rule (limit 1) admits once more.
        let d = store.check_all(&rules).await.unwrap();
        assert!(d.iter().all(|d| d.allowed), "{label}: {d:?}");
        let d = store.check_all(&rules).await.unwrap();
        assert!(d.iter().all(|d| !d.allowed), "{label}: {d:?}");
    }
}

/// A release finding foreign leases: typed, repaired.
async fn release_repairs<C>(store: &RedisStore<C>, conn: &mut dyn ConnectionLike, label: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let lease = Policy::concurrency_with_lease(2, Duration::from_secs(60)).unwrap();
    let user = format!("{label}-release");
    let user = user.as_bytes();
    let key = store.redis_key(user, &lease);
    let d = store.check(Charge::new(user, &lease, 1)).await.unwrap();
    plant(conn, &key, &bad(&[&["ZADD", "K", "inf", "1:1:1"]]));
    expect_foreign(
        store.release(user, &lease, d.permit.unwrap()).await,
        &key,
        label,
    );
    let exists: u64 = redis::cmd("EXISTS").arg(&key).query(conn).unwrap();
    assert_eq!(exists, 0, "{label}");
}

fn client_clock() -> TimeSource {
    TimeSource::client(ManualClock::starting_at(NOW_NS))
}

#[test]
fn foreign_data_under_every_algorithm_is_repaired() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let mut conn = server.conn();
        for batching in [true, false] {
            let store = RedisStore::builder()
                .time_source(client_clock())
                .hash_tag(HashTag::AfterFirst(b':'))
                .batching(batching)
                .connect(server.url().as_str())
                .await
                .unwrap();
            let label = if batching { "batched" } else { "unbatched" };
            every_algorithm(&store, &mut conn, label).await;
            all_or_nothing(&store, &mut conn, label).await;
            release_repairs(&store, &mut conn, label).await;
        }
    });
}

#[test]
fn foreign_data_on_a_cluster_is_repaired() {
    let cluster = RedisCluster::start();
    redis_support::runtime().block_on(async {
        let store = RedisStore::builder()
            .time_source(client_clock())
            .hash_tag(HashTag::AfterFirst(b':'))
            .timeout(Duration::from_secs(5))
            .connect_cluster(cluster.urls())
            .await
            .unwrap();
        let mut conn = redis::cluster::ClusterClient::new(cluster.urls())
            .unwrap()
            .get_connection()
            .unwrap();
        every_algorithm(&store, &mut conn, "cluster").await;
        all_or_nothing(&store, &mut conn, "cluster").await;
        release_repairs(&store, &mut conn, "cluster").await;
    });
}
