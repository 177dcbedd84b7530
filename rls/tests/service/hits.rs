//! `hits_addend` at its edges, on the memory store and on a real Redis:
//! upstream increments by the addend and then compares, so every value up
//! to 2^64 − 1 is counted and the next request sees it.

use crate::redis::redis_support::RedisServer;
use crate::redis::{start, CFG};
use crate::support::*;

/// An addend, its `(code, remaining)`, and the next 1-hit request's.
type Edge<H> = (H, (i32, u32), (i32, u32));

/// The descriptor-level addend's edges on `k` (5 a minute).
const DESCRIPTOR_EDGES: [Edge<u64>; 7] = [
    (0, (OK, 5), (OK, 4)),
    (1, (OK, 4), (OK, 3)),
    (5, (OK, 0), (OVER, 0)),
    (6, (OVER, 0), (OVER, 0)),
    (1 << 50, (OVER, 0), (OVER, 0)),
    ((1 << 50) + 1, (OVER, 0), (OVER, 0)),
    (u64::MAX, (OVER, 0), (OVER, 0)),
];

/// The same for the request-level addend (a u32; 0 counts as 1).
const REQUEST_EDGES: [Edge<u32>; 5] = [
    (0, (OK, 4), (OK, 3)),
    (1, (OK, 4), (OK, 3)),
    (5, (OK, 0), (OVER, 0)),
    (6, (OVER, 0), (OVER, 0)),
    (u32::MAX, (OVER, 0), (OVER, 0)),
];

async fn next_hit(rls: &mut Rls, value: &str) -> Vec<(i32, u32)> {
    codes(&rls.ask("d", vec![d(&[("k", value)])]).await)
}

/// Every edge on a key of its own, then the counter filled past its
/// capacity; the window after starts afresh.
async fn edges_are_counted(rls: &mut Rls) {
    for (hits, answer, next) in DESCRIPTOR_EDGES {
        let value = format!("descriptor-{hits}");
        let r = rls.ask("d", vec![dh(&[("k", &value)], hits)]).await;
        assert_eq!(codes(&r), vec![answer], "hits_addend {hits}");
        assert_eq!(next_hit(rls, &value).await, vec![next], "after {hits}");
    }
    for (hits, answer, next) in REQUEST_EDGES {
        let value = format!("request-{hits}");
        let mut req = request("d", vec![d(&[("k", &value)])]);
        req.hits_addend = hits;
        let r = rls.try_ask(req).await.expect("an answer");
        assert_eq!(codes(&r), vec![answer], "request hits_addend {hits}");
        assert_eq!(next_hit(rls, &value).await, vec![next], "after {hits}");
    }
    // More maximal addends than the counter holds (it saturates after
    // 1,024): each is over, none is an error, and a check still sees them.
    for i in 0..1_030 {
        let r = rls.ask("d", vec![dh(&[("k", "full")], u64::MAX)]).await;
        assert_eq!(codes(&r), vec![(OVER, 0)], "maximal addend {i}");
    }
    let r = rls.ask("d", vec![dh(&[("k", "full")], 0)]).await;
    assert_eq!(codes(&r), vec![(OVER, 0)], "a check of the full counter");
    rls.advance(60);
    assert_eq!(next_hit(rls, "full").await, vec![(OK, 4)], "a new window");
    assert_eq!(
        next_hit(rls, "descriptor-18446744073709551615").await,
        vec![(OK, 4)]
    );
}

#[tokio::test]
async fn hits_addend_edges_are_counted_on_memory() {
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    let mut rls = Rls::start(&[("d.yaml", CFG)], &env).await;
    edges_are_counted(&mut rls).await;
    // The statistics saturate too: no wrap back to a small count.
    let (_, _, text) = http(rls.running().metrics_addr.unwrap(), "GET", "/metrics", "").await;
    let line = format!(
        r#"ratelimit_service_rate_limit_total_hits{{domain="d",key1="k"}} {}"#,
        u64::MAX
    );
    assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_edges_are_counted_on_redis() {
    let redis = RedisServer::start();
    let mut rls = start(&redis, &[]).await;
    edges_are_counted(&mut rls).await;
    rls.stop().await;
}

/// Where the real policy decides (all-or-nothing, the extension
/// algorithms), a maximal addend is refused uncharged exactly as limit + 1
/// is: no error, and the next request finds the key untouched.
async fn real_policies_take_maximal_addends(rls: &mut Rls, all_or_nothing: bool) {
    for hits in [6, 1 << 50, u64::MAX] {
        let value = format!("{all_or_nothing}-{hits}");
        if all_or_nothing {
            let r = rls.ask("d", vec![dh(&[("k", &value)], hits)]).await;
            assert_eq!(codes(&r), vec![(OVER, 0)], "all or nothing, {hits}");
            assert_eq!(next_hit(rls, &value).await, vec![(OK, 4)], "{hits}");
        }
        // GCRA, 1 a second with a burst of 1: room for 2.
        let r = rls.ask("d", vec![dh(&[("g", &value)], hits)]).await;
        assert_eq!(codes(&r), vec![(OVER, 0)], "gcra, {hits}");
        let r = rls.ask("d", vec![d(&[("g", &value)])]).await;
        assert_eq!(codes(&r), vec![(OK, 1)], "gcra after {hits}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximal_addends_under_the_real_policies() {
    for all_or_nothing in [false, true] {
        let env = [(
            "RLS_ALL_OR_NOTHING",
            if all_or_nothing { "true" } else { "false" },
        )];
        let mut rls = Rls::start(&[("d.yaml", CFG)], &env).await;
        real_policies_take_maximal_addends(&mut rls, all_or_nothing).await;
        rls.stop().await;
        let redis = RedisServer::start();
        let mut rls = start(&redis, &env).await;
        real_policies_take_maximal_addends(&mut rls, all_or_nothing).await;
        rls.stop().await;
    }
}
