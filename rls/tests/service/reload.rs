//! Hot reload: new rules apply, unchanged rules keep their counts, a bad
//! file keeps the last good table and says why.

use std::time::{Duration, Instant};

use crate::support::*;

const V1: &str = "domain: d\ndescriptors:\n  - key: kept\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: changed\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const V2: &str = "domain: d\ndescriptors:\n  - key: kept\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: changed\n    rate_limit: {unit: minute, requests_per_unit: 50}\n  - key: added\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

#[tokio::test]
async fn a_reload_keeps_the_counts_of_unchanged_rules() {
    let mut rls = Rls::start(&[("d.yaml", V1)], &[]).await;
    for _ in 0..2 {
        rls.ask("d", vec![d(&[("kept", "x")]), d(&[("changed", "x")])])
            .await;
    }
    rls.rewrite("d.yaml", V2).await.unwrap();
    let r = rls
        .ask(
            "d",
            vec![
                d(&[("kept", "x")]),
                d(&[("changed", "x")]),
                d(&[("added", "x")]),
            ],
        )
        .await;
    assert_eq!(codes(&r), vec![(OK, 2), (OK, 47), (OK, 0)]);
    rls.stop().await;
}

#[tokio::test]
async fn a_bad_file_keeps_the_last_good_table_and_says_why() {
    let mut rls = Rls::start(&[("d.yaml", V1)], &[]).await;
    rls.ask("d", vec![d(&[("kept", "x")])]).await;
    let err = rls
        .rewrite(
            "d.yaml",
            "domain: d\ndescriptors:\n  - key: kept\n    rate_limit: {unit: fortnight}\n",
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "config/d.yaml:4:17: descriptors[0].rate_limit: invalid rate limit unit 'fortnight'"
    );
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("kept", "x")])]).await),
        vec![(OK, 3)]
    );
    let (_, _, dump) = http(rls.running().debug_addr, "GET", "/rlconfig", "").await;
    assert!(
        dump.contains("d.kept: unit=MINUTE requests_per_unit=5"),
        "{dump}"
    );
    assert!(
        dump.contains(&format!(
            "last configuration load failed, previous configuration kept: {err}"
        )),
        "{dump}"
    );
    rls.rewrite("d.yaml", V2).await.unwrap();
    assert!(!rls.running().limiter.dump().contains("failed"));
    rls.stop().await;
}

/// Waits (polling, bounded) until `/rlconfig` satisfies `f`.
async fn until_rlconfig(rls: &Rls, f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, _, dump) = http(rls.running().debug_addr, "GET", "/rlconfig", "").await;
        if f(&dump) || Instant::now() > deadline {
            return dump;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_directory_is_watched_without_a_restart() {
    let rls = Rls::start(&[("d.yaml", V1)], &[("RLS_RELOAD_INTERVAL", "25ms")]).await;
    rls.dir.write("d.yaml", V2);
    let dump = until_rlconfig(&rls, |d| d.contains("d.added")).await;
    assert!(dump.contains("d.added"), "{dump}");
    rls.dir.write("e.yaml", "domain: e\nbogus: 1\n");
    let dump = until_rlconfig(&rls, |d| d.contains("failed")).await;
    assert!(
        dump.contains("config/e.yaml:2:1: config error, unknown key 'bogus'"),
        "{dump}"
    );
    rls.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn watch_root_reloads_on_a_swap_of_the_root_link_only() {
    let base = Dir::new();
    let (v1, v2) = (base.0.join("v1"), base.0.join("v2"));
    for (dir, text) in [(&v1, V1), (&v2, V2)] {
        std::fs::create_dir_all(dir.join("config")).unwrap();
        std::fs::write(dir.join("config/d.yaml"), text).unwrap();
    }
    let current = base.0.join("current");
    std::os::unix::fs::symlink(&v1, &current).unwrap();
    let settings = settings(
        &base,
        &[
            ("RUNTIME_ROOT", current.to_str().unwrap()),
            ("RUNTIME_WATCH_ROOT", "true"),
        ],
    );
    let rls = Rls::start_with(Dir::new(), &settings).await;
    let reloader = rls.running().reloader.clone();
    // An edit in place is not a swap.
    std::fs::write(v1.join("config/d.yaml"), V2).unwrap();
    assert!(reloader.check().await.is_none());
    assert!(!rls.running().limiter.dump().contains("d.added"));
    // Swapping the link is.
    std::fs::write(v1.join("config/d.yaml"), V1).unwrap();
    let next = base.0.join("next");
    std::os::unix::fs::symlink(&v2, &next).unwrap();
    std::fs::rename(&next, &current).unwrap();
    assert_eq!(reloader.check().await, Some(Ok(())));
    assert!(rls.running().limiter.dump().contains("d.added"));
    rls.stop().await;
}
