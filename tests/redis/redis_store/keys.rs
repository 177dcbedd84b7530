//! Every key's TTL within the policy bound; hostile keys independent and bounded.

use crate::redis_support;

use std::time::Duration;

use super::five;
use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::Store;

// ------------------------------------------------------------------ TTLs ---

fn keys_and_ttls(server: &RedisServer, pattern: &str) -> Vec<(Vec<u8>, i64)> {
    let mut con = server.conn();
    let mut cursor = 0u64;
    let mut out = Vec::new();
    for _ in 0..1000 {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(100)
            .query(&mut con)
            .unwrap();
        for k in keys {
            let ttl: i64 = redis::cmd("PTTL").arg(&k).query(&mut con).unwrap();
            out.push((k, ttl));
        }
        if next == 0 {
            return out;
        }
        cursor = next;
    }
    panic!("SCAN did not finish");
}

#[test]
fn every_key_has_a_ttl_within_the_policy_bound() {
    let server = RedisServer::start();
    // A frozen clock 1 s into a 10 s window: with the server's own clock a
    // window could end mid-test and take a key (and its TTL) with it.
    let clock = ManualClock::starting_at(1_700_000_001_000_000_000);
    runtime().block_on(async {
        let store = RedisStore::builder()
            .prefix("ttl")
            .time_source(TimeSource::client(clock.clone()))
            .connect(server.url())
            .await
            .unwrap();
        let policies = five(3);
        // GCRA τ = 3 × 10 s (its expiry rounded up to a whole second), log w,
        // fixed w (aligned: at most w), sliding 2w, lease.
        let bounds = [31_000, 10_000, 10_000, 20_000, 10_000];
        let assert_ttls = |step: &str| {
            let found = keys_and_ttls(&server, "ttl:*");
            for (key, ttl) in &found {
                let i = policies
                    .iter()
                    .position(|p| key[15] == store.redis_key(b"", p)[15]) // ttl:{tag}:<algo>:
                    .expect("a key of a known algorithm");
                assert!(
                    *ttl > 0 && *ttl <= bounds[i],
                    "{step}: {} PTTL {ttl} ms",
                    String::from_utf8_lossy(key)
                );
            }
            found.len()
        };
        for (i, p) in policies.iter().enumerate() {
            let key = format!("k{i}").into_bytes();
            let admitted = store.check(Charge::new(&key, p, 2)).await.unwrap();
            assert!(admitted.allowed);
            assert_ttls("after an admission");
            assert!(!store.check(Charge::new(&key, p, 2)).await.unwrap().allowed);
            assert_ttls("after a denial");
            let receipt = admitted.receipt().expect("an admitted charge");
            store.refund(&key, p, &receipt.part(1)).await.unwrap();
            assert_ttls("after a refund");
            // A second key checked then fully given back leaves nothing behind.
            let gone = format!("gone{i}").into_bytes();
            let d = store.check(Charge::new(&gone, p, 1)).await.unwrap();
            if let Some(id) = d.permit {
                store.release(&gone, p, id).await.unwrap();
            } else {
                let receipt = d.receipt().expect("an admitted charge");
                store.refund(&gone, p, &receipt).await.unwrap();
            }
        }
        assert_eq!(assert_ttls("at the end"), 5);
    });
}

// ------------------------------------------------------------ hostile keys ---

pub fn hostile_keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = [
        &b""[..],
        b"{",
        b"}",
        b"{}",
        b"}{",
        b"a{b}c",
        b"{user}:x",
        b"line\nbreak",
        b"nul\0byte",
        b"\r\n*3\r\n$3\r\nDEL\r\n",
        "ünïcödé".as_bytes(),
    ]
    .iter()
    .map(|k| k.to_vec())
    .collect();
    keys.push(vec![b'{'; 10_000]);
    keys.push((0..10_000u32).map(|i| (i * 7919 % 251) as u8).collect());
    let mut near = vec![b'}'; 10_000];
    near[9_999] = b'{';
    keys.push(near);
    keys
}

#[test]
fn hostile_keys_are_independent_and_bounded() {
    let server = RedisServer::start();
    runtime().block_on(async {
        // A frozen clock with padded TTLs: on the server's clock a 10 s
        // window could end mid-test and take its keys with it.
        let store = RedisStore::builder()
            .prefix("h")
            .time_source(TimeSource::client(ManualClock::new()))
            .ttl_padding(Duration::from_secs(600))
            .connect(server.url())
            .await
            .unwrap();
        let keys = hostile_keys();
        for p in five(3) {
            for k in &keys {
                let d = store.check(Charge::new(k, &p, 1)).await.unwrap();
                assert!(d.allowed);
                assert_eq!(
                    d.remaining,
                    2,
                    "every key starts fresh: {:?}",
                    String::from_utf8_lossy(&k[..k.len().min(20)])
                );
                let rk = store.redis_key(k, &p);
                assert!(rk.len() <= 2 + 12 + 2 + 1 + 128, "{} bytes", rk.len());
            }
        }
        assert_eq!(keys_and_ttls(&server, "h:*").len(), keys.len() * 5);
    });
}
