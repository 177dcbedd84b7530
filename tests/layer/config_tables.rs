//! Several rule tables on one store (feature `config`): a file or a reload
//! that would make two tables share a key namespace is refused like a bad
//! file, never a panic on every request; random configurations either load
//! or fail with an error, and serve without a panic; a reload under load
//! loses and double-counts nothing.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{LayerConfig, RuleTable};
use tower_throttle::MemoryStore;

fn frozen() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

fn ok(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<()>| async { Ok(Response::new(Full::new(Bytes::new()))) })
}

fn from(user: &str) -> Request<()> {
    Request::builder()
        .header("x-user-id", user)
        .body(())
        .unwrap()
}

fn rules(prefix: &str, name: &str, limit: u64) -> String {
    format!(
        "prefix: {prefix}\nkey: {{ header: x-user-id }}\nrules:\n  - name: {name}\n    policy: {{ fixed_window: {{ limit: {limit}, window: 60s }} }}\n"
    )
}

/// A file in a directory of this test's own.
fn file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-throttle-config-tables-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Two tables on one store: the second file names the first's namespace.
/// It is refused at load (file and field named), and a reload of a
/// running table onto it is refused too, keeping the last good rules,
/// which go on serving.
#[tokio::test]
async fn a_second_table_on_the_same_namespace_is_refused_at_load_and_at_reload() {
    let store = frozen();
    let reply =
        RuleTable::from_path(store.clone(), file("reply.yaml", &rules("ugc", "reply", 2))).unwrap();
    let mut reply_svc = reply.layer("default").unwrap().layer(ok());
    reply_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();

    let clash = file("clash.yaml", &rules("ugc", "reply", 9));
    let e = RuleTable::from_path(store.clone(), &clash).unwrap_err();
    assert_eq!(e.source, clash.display().to_string());
    assert_eq!(e.field.as_deref(), Some("rules[0]"), "{e}");
    assert!(
        e.to_string().contains("ugc:reply:"),
        "names the namespace: {e}"
    );

    let post_path = file("post.yaml", &rules("ugc", "post", 3));
    let post = RuleTable::from_path(store.clone(), &post_path).unwrap();
    let mut post_svc = post.layer("default").unwrap().layer(ok());
    post_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();
    std::fs::write(&post_path, rules("ugc", "reply", 3)).unwrap();
    let e = post.reload_from_path(&post_path).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("rules[0]"), "{e}");
    assert_eq!(post.generation(), 0, "the last good table stays");

    // Both go on serving, each with its own counters.
    let second = reply_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    let third = reply_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    for _ in 0..2 {
        let r = post_svc
            .ready()
            .await
            .unwrap()
            .call(from("ann"))
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let over = post_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);

    // A table reloaded onto names it held itself keeps them.
    std::fs::write(&post_path, rules("ugc", "post", 4)).unwrap();
    post.reload_from_path(&post_path).unwrap();
    assert_eq!(post.generation(), 1);
    let r = post_svc
        .ready()
        .await
        .unwrap()
        .call(from("ann"))
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "the 4th of 4 under the new limit"
    );
    std::fs::remove_dir_all(post_path.parent().unwrap()).unwrap();
}

fn config_text() -> impl Strategy<Value = String> {
    let prefix = prop_oneof![Just(None), Just(Some("a")), Just(Some("b"))];
    let name = prop_oneof![Just("x"), Just("y"), Just("x")];
    let limit = prop_oneof![Just(0u64), Just(1), 2..=5u64, Just(u64::MAX)];
    let rule = (name, limit, any::<bool>());
    (prefix, proptest::collection::vec(rule, 0..=3)).prop_map(|(prefix, rules)| {
        let mut text = String::from("key: { header: x-user-id }\n");
        if let Some(p) = prefix {
            text += &format!("prefix: {p}\n");
        }
        text += "rules:";
        if rules.is_empty() {
            text += " []";
        }
        for (name, limit, log) in rules {
            let algorithm = if log { "sliding_log" } else { "fixed_window" };
            text += &format!("\n  - name: {name}\n    policy: {{ {algorithm}: {{ limit: {limit}, window: 60s }} }}");
        }
        text + "\n"
    })
}

/// Random configurations, in pairs on one store, then a random reload of
/// the first: each either fails to load with an error or serves requests
/// without a panic.
#[test]
fn random_tables_on_one_store_load_or_fail_but_never_panic() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(a in config_text(), b in config_text(), reload in config_text())| {
        rt.block_on(async {
            let store = frozen();
            let load = |text: &str| {
                LayerConfig::parse("t.yaml", text).and_then(|c| RuleTable::new(store.clone(), c))
            };
            let tables: Vec<_> = [load(&a), load(&b)].into_iter().flatten().collect();
            if let (Some(first), Ok(config)) = (tables.first(), LayerConfig::parse("r.yaml", &reload)) {
                let _ = first.reload(config);
            }
            for table in &tables {
                let mut svc = table.layer("default").unwrap().layer(ok());
                for user in ["ann", "bob"] {
                    let r = svc.ready().await.unwrap().call(from(user)).await.unwrap();
                    assert!(matches!(r.status(), StatusCode::OK | StatusCode::TOO_MANY_REQUESTS));
                }
            }
        });
    });
}

/// Requests from 4 tasks while the table is reloaded 20 times between two
/// files that keep the rule (name and policy) and change the rest: exactly
/// the limit is admitted on a frozen clock — no request lost, none counted
/// twice — and every request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_loses_and_double_counts_nothing() {
    const LIMIT: usize = 50;
    let a = format!(
        "{}headers_on_allowed: true\n",
        rules("load", "reply", LIMIT as u64)
    );
    let b = format!(
        "{}headers_on_allowed: false\n",
        rules("load", "reply", LIMIT as u64)
    );
    let table = RuleTable::new(frozen(), LayerConfig::parse("a.yaml", &a).unwrap()).unwrap();
    let admitted = Arc::new(AtomicUsize::new(0));
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let svc = table.layer("default").unwrap().layer(ok());
            let (admitted, answered) = (admitted.clone(), answered.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    let r = svc.clone().oneshot(from("ann")).await.unwrap();
                    answered.fetch_add(1, Ordering::SeqCst);
                    if r.status() == StatusCode::OK {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for i in 0..20 {
        let text = if i % 2 == 0 { &b } else { &a };
        table
            .reload(LayerConfig::parse("r.yaml", text).unwrap())
            .unwrap();
        tokio::task::yield_now().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(table.generation(), 20);
    assert_eq!(answered.load(Ordering::SeqCst), 160);
    assert_eq!(admitted.load(Ordering::SeqCst), LIMIT);
}
