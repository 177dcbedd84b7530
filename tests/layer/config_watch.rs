//! The watcher (feature `config`): a table reloads itself when its file's
//! content changes — written in place, renamed over (editors), or swapped
//! behind a symlink (Kubernetes ConfigMaps) — and on SIGHUP; a refused
//! file keeps the running limits and is logged once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tower_throttle::clock::ManualClock;
use tower_throttle::config::{RuleTable, WatchOutcome};
use tower_throttle::MemoryStore;

fn limits(limit: u64) -> String {
    format!("rules: [{{ name: reply, policy: {{ fixed_window: {{ limit: {limit}, window: 60s }} }} }}]\n")
}

/// A directory of this test's own, emptied first.
fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-throttle-watch-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn table(path: &Path) -> RuleTable<MemoryStore<ManualClock>> {
    RuleTable::from_path(
        MemoryStore::builder().clock(ManualClock::new()).build(),
        path,
    )
    .unwrap()
}

fn limit_now(table: &RuleTable<MemoryStore<ManualClock>>) -> u64 {
    table.config().route("default").unwrap().rules[0]
        .policy
        .0
        .limit()
}

#[test]
fn a_look_reloads_new_content_only_and_refuses_a_bad_file_once() {
    let dir = dir("poll");
    let path = dir.join("limits.yaml");
    std::fs::write(&path, limits(5)).unwrap();
    let table = table(&path);
    let mut watch = table.watcher(&path);
    assert!(matches!(watch.poll(), WatchOutcome::Unchanged));
    // Rewritten with the same bytes: nothing to do.
    std::fs::write(&path, limits(5)).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Unchanged));
    std::fs::write(&path, limits(7)).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Reloaded(1)));
    assert_eq!(limit_now(&table), 7);

    // The binary's global subscriber (a scoped one can miss events whose
    // callsite another thread cached as uninteresting); this test's own
    // directory tells its lines from other tests'.
    let capture = crate::capture::Capture::install();
    let error = tracing::Level::ERROR;
    let ours = |capture: &crate::capture::Capture| {
        capture.count_all(error, &["watch-", "-poll", "rules[0].policy"])
    };
    let before = ours(&capture);
    std::fs::write(&path, limits(0)).unwrap();
    let WatchOutcome::Refused(e) = watch.poll() else {
        panic!("a limit of 0 was not refused");
    };
    assert_eq!(e.field.as_deref(), Some("rules[0].policy"), "{e}");
    assert!(
        matches!(watch.poll(), WatchOutcome::Unchanged),
        "refused once, not every look"
    );
    assert_eq!(ours(&capture) - before, 1, "{}", capture.dump());
    assert_eq!(limit_now(&table), 7, "the running limits stay");
    assert_eq!(table.generation(), 1);

    std::fs::remove_file(&path).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Unreadable(_)));
    std::fs::write(&path, limits(9)).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Reloaded(2)));
    std::fs::remove_dir_all(dir).unwrap();
}

/// An editor writes a new file beside the old one and renames it over.
#[test]
fn a_file_renamed_over_the_watched_one_is_loaded() {
    let dir = dir("rename");
    let path = dir.join("limits.yaml");
    std::fs::write(&path, limits(5)).unwrap();
    let table = table(&path);
    let mut watch = table.watcher(&path);
    let swap = dir.join(".limits.yaml.swp");
    std::fs::write(&swap, limits(6)).unwrap();
    std::fs::rename(&swap, &path).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Reloaded(1)));
    assert_eq!(limit_now(&table), 6);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A Kubernetes ConfigMap volume: `limits.yaml -> ..data/limits.yaml`,
/// `..data -> ..2026_11_27_v1`; an update writes a new directory and swaps
/// `..data` by renaming a new symlink over it.
#[cfg(unix)]
#[test]
fn a_configmap_symlink_swap_is_loaded() {
    use std::os::unix::fs::symlink;
    let dir = dir("configmap");
    let v1 = dir.join("..2026_11_27_v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("limits.yaml"), limits(5)).unwrap();
    symlink("..2026_11_27_v1", dir.join("..data")).unwrap();
    symlink("..data/limits.yaml", dir.join("limits.yaml")).unwrap();
    let path = dir.join("limits.yaml");
    let table = table(&path);
    let mut watch = table.watcher(&path);
    assert!(matches!(watch.poll(), WatchOutcome::Unchanged));

    let v2 = dir.join("..2026_11_27_v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("limits.yaml"), limits(8)).unwrap();
    symlink("..2026_11_27_v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(&v1).unwrap();
    assert!(matches!(watch.poll(), WatchOutcome::Reloaded(1)));
    assert_eq!(limit_now(&table), 8);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Waits (bounded) until the table's generation reaches `n`.
async fn generation(table: &RuleTable<MemoryStore<ManualClock>>, n: u64) {
    let reached = async {
        while table.generation() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), reached)
        .await
        .unwrap_or_else(|_| panic!("generation {n} never came"));
}

/// The running watch: on its interval, and on SIGHUP with an interval too
/// long to matter; dropped, it stops.
#[tokio::test]
async fn the_running_watch_reloads_on_its_interval_and_on_sighup() {
    let dir = dir("running");
    let path = dir.join("limits.yaml");
    std::fs::write(&path, limits(5)).unwrap();
    let table = table(&path);
    let handle = table.watcher(&path).spawn(Duration::from_millis(10));
    std::fs::write(&path, limits(6)).unwrap();
    generation(&table, 1).await;
    drop(handle);

    #[cfg(unix)]
    {
        let handle = table.watcher(&path).spawn(Duration::from_secs(3600));
        // The first look is an hour away: only the signal can reload.
        std::fs::write(&path, limits(7)).unwrap();
        let pid = std::process::id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        generation(&table, 2).await;
        assert_eq!(limit_now(&table), 7);
        drop(handle);
    }
    std::fs::remove_dir_all(dir).unwrap();
}
