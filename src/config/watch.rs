//! Reloading a table when its file changes, or on SIGHUP.

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{ConfigError, RuleTable};
use crate::store::Store;

/// How often [`RuleTable::watch`] looks at the file.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What one look at the file found: see [`FileWatch::poll`].
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchOutcome {
    /// The same content as the last look (or as the table was loaded with).
    Unchanged,
    /// New content, loaded: the table's generation now.
    Reloaded(u64),
    /// New content, refused: the running limits stay. Logged once per content.
    Refused(ConfigError),
    /// The file cannot be read (being replaced, say): the running limits
    /// stay and the next look tries again.
    Unreadable(String),
}

/// Watches one file for a [`RuleTable`]: [`poll`](Self::poll) looks once
/// (tests and custom schedules), [`spawn`](Self::spawn) looks on an
/// interval and on SIGHUP.
///
/// A look reads the file through its path, following symlinks, and
/// compares its bytes with the last ones seen, so a rename over the file
/// (editors), a symlink swap (Kubernetes ConfigMaps swap `..data`) and an
/// in-place write are all seen, and a touch that changes nothing reloads
/// nothing.
#[derive(Debug)]
pub struct FileWatch<St> {
    table: RuleTable<St>,
    path: PathBuf,
    /// The fingerprint of the content last loaded or refused.
    last: Option<u64>,
}

impl<St: Store> RuleTable<St> {
    /// A watch of `path` for this table, taking the file as it is now as
    /// already loaded (the table was loaded from it).
    pub fn watcher(&self, path: impl Into<PathBuf>) -> FileWatch<St> {
        let path = path.into();
        let last = std::fs::read(&path).ok().map(|bytes| fingerprint(&bytes));
        FileWatch {
            table: self.clone(),
            path,
            last,
        }
    }

    /// Reloads the table from `path` whenever its content changes (looked
    /// at every [`DEFAULT_WATCH_INTERVAL`]) and, on Unix, on SIGHUP; each
    /// new generation is logged at info level and each refusal at error
    /// level with its file, line and field (the running limits stay). Runs
    /// on the current Tokio runtime until the handle is dropped.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn watch(&self, path: impl Into<PathBuf>) -> WatchHandle {
        self.watcher(path).spawn(DEFAULT_WATCH_INTERVAL)
    }
}

impl<St: Store> FileWatch<St> {
    /// Looks at the file once and reloads the table if its content changed.
    pub fn poll(&mut self) -> WatchOutcome {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) => return WatchOutcome::Unreadable(e.to_string()),
        };
        let seen = fingerprint(&bytes);
        if self.last == Some(seen) {
            return WatchOutcome::Unchanged;
        }
        self.last = Some(seen);
        match self.table.reload_from_path(&self.path) {
            Ok(()) => {
                let generation = self.table.generation();
                tracing::info!(target: "tower_throttle", file = %self.path.display(), generation, "rate limits reloaded");
                WatchOutcome::Reloaded(generation)
            }
            Err(e) => {
                tracing::error!(target: "tower_throttle", file = %self.path.display(), error = %e, "rate limits not reloaded: the running limits stay");
                WatchOutcome::Refused(e)
            }
        }
    }

    /// The file watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks at the file every `interval` (at least 10 ms) and, on Unix, on
    /// each SIGHUP, on the current Tokio runtime, until the handle is dropped.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn spawn(mut self, interval: Duration) -> WatchHandle
    where
        St: 'static,
    {
        let interval = interval.max(Duration::from_millis(10));
        // The first look after one interval: the file was just loaded.
        let first = tokio::time::Instant::now() + interval;
        let mut ticks = tokio::time::interval_at(first, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Registered before this returns: a SIGHUP sent after `spawn` is seen.
        let mut hangups = hangups();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    Some(()) = next_hangup(&mut hangups) => {
                        tracing::info!(target: "tower_throttle", file = %self.path.display(), "SIGHUP: looking at the rate limits file");
                    }
                }
                let _ = self.poll();
            }
        });
        WatchHandle(task)
    }
}

/// A running [`FileWatch`]: dropping it stops the watch.
#[derive(Debug)]
pub struct WatchHandle(tokio::task::JoinHandle<()>);

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    // Fixed keys: fingerprints are compared within one process only.
    let mut hasher = foldhash::quality::FixedState::with_seed(0x7468_726f_7474_6c65).build_hasher();
    hasher.write(bytes);
    hasher.finish()
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

#[cfg(unix)]
fn hangups() -> Hangups {
    // No handler (another part of the program owns signals): interval only.
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}

#[cfg(not(unix))]
fn hangups() -> Hangups {}

#[cfg(unix)]
async fn next_hangup(hangups: &mut Hangups) -> Option<()> {
    match hangups {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangups) -> Option<()> {
    std::future::pending().await
}
