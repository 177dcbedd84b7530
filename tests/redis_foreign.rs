//! Foreign data at the crate's Redis keys: values another program wrote.
//! A GCRA check finding one fails alone with a typed error naming the key,
//! the key is deleted, and the next check finds it fresh — nobody stays
//! locked out (a "1e30" read as a tat would deny forever).

#[path = "support/redis.rs"]
mod redis_support;

use std::time::Duration;

use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::store::redis::RedisStore;
use tower_throttle::{Policy, Rule, Store, StoreError};

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
                    .check(Rule::new(user.as_bytes(), p, 1))
                    .await
                    .unwrap_err();
                let StoreError::ForeignData { key: named, .. } = &err else {
                    panic!("{value}: {err:?}")
                };
                assert_eq!(named.as_bytes(), &key[..], "{value}");
                assert!(err.to_string().contains("another program"), "{err}");
                // Repaired: a fresh key admits its whole burst.
                for _ in 0..2 {
                    let d = store.check(Rule::new(user.as_bytes(), p, 1)).await.unwrap();
                    assert!(d.allowed, "{value}: {d:?}");
                }
                let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
                assert!(ttl > 0 && ttl <= 3_000, "{value}: {ttl}");
            }
        }
    });
}
