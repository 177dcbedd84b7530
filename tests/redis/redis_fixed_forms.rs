//! How a fixed-window state is kept (`fixed_window.lua`): packed as one
//! integer, index·2^20 + count, while the window index is below 2^33 and
//! the count below 2^20, so a busy key's admission is an `INCRBY` that
//! keeps its expiry; the string `"<index>:<count>"` beyond. Both forms read
//! back to the same state, and the batch of one policy's checks
//! (`fixed_batch.lua`) decides exactly as the check script does, the same
//! key twice in a batch included.

use crate::redis_batches::admitted_of_a_crowd;
use crate::redis_support;

use std::time::Duration;

use redis_support::{current_thread_runtime, RedisServer};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

const PACK: u64 = 1 << 20;

async fn store_on(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("ff")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .connect(server.url())
        .await
        .unwrap()
}

fn value(server: &RedisServer, key: &[u8]) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

fn pttl(server: &RedisServer, key: &[u8]) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn a_state_is_packed_while_it_fits_and_a_string_beyond() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        let clock = ManualClock::new();
        let window = Duration::from_secs(60);
        let w_ns = u64::try_from(window.as_nanos()).unwrap();
        clock.set_ns((clock.now_ns() / w_ns + 10) * w_ns + 1_000_000_000);
        let index = clock.now_ns() / w_ns;
        let store = store_on(&server, &clock).await;
        let limit = 2 * PACK;
        let policy = Policy::fixed_window(limit, window).unwrap();
        let key = store.redis_key(b"u", &policy);
        let check = |cost| store.check(Charge::new(b"u", &policy, cost));

        // Packed: index·2^20 + count, set with the window's expiry.
        let d = check(PACK - 2).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, limit - (PACK - 2));
        assert_eq!(
            value(&server, &key),
            Some((index * PACK + PACK - 2).to_string())
        );
        let first_ttl = pttl(&server, &key);
        assert!(first_ttl > 58_000 && first_ttl <= 59_000, "{first_ttl}");
        // An admission in the same window adds to it in place (INCRBY),
        // keeping the expiry although the clock moved 30 s on.
        clock.advance(Duration::from_secs(30));
        let d = check(1).await.unwrap();
        assert_eq!(d.remaining, limit - (PACK - 1));
        assert_eq!(
            value(&server, &key),
            Some((index * PACK + PACK - 1).to_string())
        );
        assert!(pttl(&server, &key) > 50_000, "the expiry moved");
        // A count of 2^20 no longer fits: the string form, same expiry.
        let d = check(1).await.unwrap();
        assert_eq!(d.remaining, limit - PACK);
        assert_eq!(value(&server, &key), Some(format!("{index}:{PACK}")));
        assert!(pttl(&server, &key) > 50_000, "the expiry moved");
        // Read back from the string form: the limit holds to the unit.
        assert!(check(PACK).await.unwrap().allowed);
        let d = check(1).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        // The next window starts packed again, with its own expiry.
        clock.advance(Duration::from_secs(30));
        let d = check(3).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, limit - 3);
        assert_eq!(
            value(&server, &key),
            Some(((index + 1) * PACK + 3).to_string())
        );
        let ttl = pttl(&server, &key);
        assert!(ttl > 58_000 && ttl <= 60_000, "{ttl}");
    });
}

#[test]
fn windows_shorter_than_a_packed_index_allows_keep_the_string_form() {
    let server = RedisServer::start();
    current_thread_runtime().block_on(async {
        // 100 ms windows: the index passes 2^33 after 27 years of Unix time.
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = store_on(&server, &clock).await;
        let policy = Policy::fixed_window(2, Duration::from_millis(100)).unwrap();
        let key = store.redis_key(b"u", &policy);
        let index = clock.now_ns() / 100_000_000;
        assert!(index >= 1 << 33);
        for expected in [true, true, false] {
            let d = store.check(Charge::new(b"u", &policy, 1)).await.unwrap();
            assert_eq!(d.allowed, expected);
        }
        assert_eq!(value(&server, &key), Some(format!("{index}:2")));
    });
}

/// Many checks of one key queued at once, on every key of a batch: the
/// batches carry the same key many times, and admit exactly the limit.
#[test]
fn a_crowd_on_one_key_is_admitted_exactly_to_the_limit_in_both_forms() {
    let server = RedisServer::start();
    let rt = redis_support::runtime();
    rt.block_on(async {
        let store = RedisStore::builder()
            .prefix("fc")
            .connect(server.url())
            .await
            .unwrap();
        // Packed (a limit of 10), and the string form (a window filled to
        // 10 below a limit past 2^20 first).
        for (limit, window) in [
            (10, Duration::from_secs(3600)),
            (PACK + 10, Duration::from_secs(3600)),
        ] {
            let policy = Policy::fixed_window(limit, window).unwrap();
            for round in 0..10 {
                let key = format!("k{limit}:{round}").into_bytes();
                if limit > PACK {
                    // Fill the window to 10 below its limit, in the string form.
                    let d = store.check(Charge::new(&key, &policy, PACK)).await.unwrap();
                    assert!(d.allowed);
                }
                let admitted = admitted_of_a_crowd(&store, &key, &policy, 64).await;
                assert_eq!(admitted, 10, "limit {limit}, round {round}");
            }
        }
    });
}
