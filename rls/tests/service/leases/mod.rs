//! Hot descriptors on Redis served from leases (`RLS_LEASES`, on by default
//! with Redis), on a real `redis-server`: four processes of the real binary
//! admit a hot key's limit exactly (never over, and all of it once every
//! process has answered over), with an upstream pod's `INCRBY`s on the same
//! key too, in a fraction of the Redis calls; and every seam (hits_addend
//! at its edges, shadow mode, `unlimited`, statistics, `/json`, the memory
//! fallback, an outage) answers as without leases.

mod fleet;
mod seams;

use fleet::{Fleet, LIMIT};
use tokio::task::JoinSet;

use crate::redis::redis_support::RedisServer;
use crate::shared_counters::{get, upstream_hit};
use crate::support::Dir;

/// Concurrent clients per process.
const CLIENTS: usize = 8;
/// Requests per client in the concurrent phase: 3.2× the limit in all.
const PER_CLIENT: usize = 100;

/// Admitted, asked: the concurrent phase, then each process alone until it
/// answers over (from then on it holds no count within the limit: a
/// process spends its counts in order, one lease at a time).
async fn hammer(fleet: &Fleet) -> (u64, u64) {
    let mut tasks = JoinSet::new();
    for server in &fleet.servers {
        for _ in 0..CLIENTS {
            let mut client = server.client().await;
            tasks.spawn(async move {
                let mut ok = 0;
                for _ in 0..PER_CLIENT {
                    ok += u64::from(fleet::hot(&mut client).await);
                }
                ok
            });
        }
    }
    let mut admitted: u64 = tasks.join_all().await.into_iter().sum();
    let mut asked = (fleet.servers.len() * CLIENTS * PER_CLIENT) as u64;
    for server in &fleet.servers {
        let mut client = server.client().await;
        // Bounded: the limit plus two blocks at most.
        for _ in 0..LIMIT + 2_048 {
            asked += 1;
            if !fleet::hot(&mut client).await {
                break;
            }
            admitted += 1;
        }
    }
    (admitted, asked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_admit_a_hot_keys_limit_exactly() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis, &[]).await;
    let calls_before = fleet::incrby_calls(&redis);
    let (admitted, asked) = hammer(&fleet).await;
    assert_eq!(
        admitted, LIMIT,
        "never over; all of it once every process is over"
    );
    // Every hit counted, as upstream counts rejected ones; at most the
    // counts the processes still hold beyond.
    let count = get(&mut redis.conn(), &fleet::key()).unwrap();
    assert!(
        count >= asked && count <= asked + 4 * 1_024,
        "{count} for {asked}"
    );
    // Served from leases: a fraction of the INCRBYs one per check would be.
    let calls = fleet::incrby_calls(&redis) - calls_before;
    assert!(calls * 4 < asked, "{calls} INCRBYs for {asked} checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_pod_on_the_same_key_shares_the_limit() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis, &[]).await;
    let key = fleet::key();
    let mut conn = redis.conn();
    // An envoyproxy/ratelimit pod: INCRBY 1 + EXPIRE, over iff the count
    // after passes the limit; bounded, alongside the processes' clients.
    let pod = std::thread::spawn(move || {
        let mut ok = 0;
        for _ in 0..1_500 {
            ok += u64::from(upstream_hit(&mut conn, &key, 1, 3_600) <= LIMIT);
        }
        ok
    });
    let (admitted, _) = hammer(&fleet).await;
    let by_pod = pod.join().unwrap();
    assert!(by_pod > 0, "the pod took part");
    assert_eq!(
        admitted + by_pod,
        LIMIT,
        "the servers {admitted}, the pod {by_pod}"
    );
}

/// On the crate's keys the counts are the crate's fixed window's (exact
/// the same way); in all-or-nothing mode the crate's `LeasingStore` leases
/// the real limit, never over it (holding back up to a block and a quarter
/// per process, more than this limit: no lower bound here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crates_keys_and_all_or_nothing_never_admit_over() {
    for (env, least) in [
        (("RLS_REDIS_KEYS", "crate"), LIMIT),
        (("RLS_ALL_OR_NOTHING", "true"), 1),
    ] {
        let redis = RedisServer::start();
        let fleet = Fleet::start(&redis, &[env]).await;
        let (admitted, _) = hammer(&fleet).await;
        assert!((least..=LIMIT).contains(&admitted), "{env:?}: {admitted}");
    }
}

/// `RLS_LEASES` is named in the start line, and a value that cannot be used
/// stops the start naming the variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setting_is_named_at_start_and_checked() {
    let redis = RedisServer::start();
    let fleet = Fleet::start(&redis, &[("RLS_LEASES", "off")]).await;
    let line = fleet.servers[0].start_line.clone();
    assert!(line.contains("leases off (RLS_LEASES=off)"), "{line}");
    drop(fleet);
    let url = format!("127.0.0.1:{}", redis.port);
    let redis_env = [("REDIS_URL", url.as_str()), ("REDIS_SOCKET_TYPE", "tcp")];
    for (env, why) in [
        (vec![("RLS_LEASES", "yes")], "expected on or off"),
        (vec![("RLS_LEASES", "")], "expected on or off"),
        (vec![("RLS_LEASES", "on")], "needs a Redis backend"),
        (
            [&redis_env[..], &[("RLS_LEASES", "On")]].concat(),
            "expected on or off",
        ),
    ] {
        let out = std::process::Command::new(crate::process::BIN)
            .env_clear()
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {err}");
        assert!(err.contains("RLS_LEASES") && err.contains(why), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// SIGTERM gives back what the leases hold before the process exits: the
/// shared counter then holds exactly the admitted hits, as if no lease had
/// been taken, so a rolling restart costs the fleet nothing of its limit
/// (without it, a block's unspent counts lapse with the window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_gives_back_what_the_leases_hold() {
    let redis = RedisServer::start();
    let dir = Dir::new();
    dir.write("lease.yaml", fleet::CFG);
    let mut server = fleet::start_one(&redis, &dir, &[]).await;
    let mut client = server.client().await;
    let hits = 100;
    for _ in 0..hits {
        assert!(fleet::hot(&mut client).await);
    }
    let mut conn = redis.conn();
    let counted = get(&mut conn, &fleet::key()).unwrap();
    assert!(counted > hits, "a lease holds counts: {counted}");
    assert!(server.terminate().await.success());
    let after = get(&mut conn, &fleet::key()).unwrap();
    assert_eq!(
        after,
        hits,
        "given back at SIGTERM (held {})",
        counted - hits
    );
}
