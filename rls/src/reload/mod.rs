//! Hot reload, by polling (every `RLS_RELOAD_INTERVAL`), with upstream's
//! `RUNTIME_WATCH_ROOT` meaning:
//!
//! * `true` (default): reload when `RUNTIME_ROOT` is swapped, i.e. when the
//!   path it resolves to (through symlinks) changes, the way deployments
//!   publish a new runtime directory and swap a `current` link.
//! * `false`: reload when any file of the config directory is written,
//!   created or removed.
//!
//! A load that fails keeps the table in force, logs why at error level,
//! and `/rlconfig` shows the error until a load succeeds. Counter keys are
//! made of the domain, the request's entries and the window, never of the
//! table, so unchanged rules keep their counts across a reload.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{self, LoadOptions};
use crate::service::RateLimiter;
use crate::settings::Settings;

/// Watches the configuration and puts new tables in force.
pub struct Reloader {
    root: PathBuf,
    dir: PathBuf,
    watch_root: bool,
    options: LoadOptions,
    limiter: Arc<RateLimiter>,
    seen: tokio::sync::Mutex<Option<Fingerprint>>,
}

/// What decides whether to reload.
#[derive(PartialEq, Eq)]
enum Fingerprint {
    Root(Option<PathBuf>),
    Files(Vec<(String, String)>),
}

impl Reloader {
    /// A reloader for `settings`' config directory, feeding `limiter`.
    pub fn new(settings: &Settings, limiter: Arc<RateLimiter>) -> Reloader {
        Reloader {
            root: settings.runtime_root.clone(),
            dir: settings.config_dir(),
            watch_root: settings.runtime_watch_root,
            options: LoadOptions {
                merge_domains: settings.merge_domain_config,
                strict_upstream_keys: settings.strict_upstream_keys,
                ignore_dotfiles: settings.runtime_ignore_dotfiles,
            },
            limiter,
            seen: tokio::sync::Mutex::new(None),
        }
    }

    fn fingerprint(&self) -> Fingerprint {
        if self.watch_root {
            Fingerprint::Root(std::fs::canonicalize(&self.root).ok())
        } else {
            // Unreadable files are a change too: the load reports them.
            Fingerprint::Files(config::read_dir(&self.dir, self.options).unwrap_or_default())
        }
    }

    /// Loads the configuration now, whatever changed. `Ok(())` when the
    /// new table is in force; otherwise the error, and the old table stays.
    pub async fn load(&self) -> Result<(), config::ConfigError> {
        let mut seen = self.seen.lock().await;
        *seen = Some(self.fingerprint());
        self.apply(true)
    }

    /// Loads the configuration if it changed since the last look; `None`
    /// when it did not.
    pub async fn check(&self) -> Option<Result<(), config::ConfigError>> {
        let mut seen = self.seen.lock().await;
        let now = self.fingerprint();
        if seen.as_ref() == Some(&now) {
            return None;
        }
        *seen = Some(now);
        Some(self.apply(false))
    }

    /// Loads; the first load's outcome is said by the start line.
    fn apply(&self, first: bool) -> Result<(), config::ConfigError> {
        let loaded = config::load_dir(&self.dir, self.options)
            .and_then(|table| self.limiter.check_table(&table).map(|()| table));
        match loaded {
            Ok(table) => {
                let (domains, limits) = table.summary();
                if domains.is_empty() && !first {
                    tracing::warn!(dir = %self.dir.display(),
                        "the rate-limit configuration now has no domain: every request is \
                         answered OK without a limit");
                } else {
                    tracing::info!(dir = %self.dir.display(), domains = domains.len(), limits,
                        "loaded the rate-limit configuration");
                }
                self.limiter.set_table(table);
                Ok(())
            }
            Err(e) => {
                if self.limiter.table().is_some() {
                    tracing::error!(error = %e,
                        "configuration refused; the previous one stays in force");
                } else {
                    tracing::error!(error = %e,
                        "configuration refused; none is in force, so every request fails \
                         until a valid one is loaded");
                }
                self.limiter.set_error(e.to_string());
                Err(e)
            }
        }
    }

    /// Polls every `every`, forever.
    pub async fn watch(self: Arc<Self>, every: std::time::Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Config files are small: reading them inline is cheap.
            let _ = self.check().await;
        }
    }
}
