//! Per-limit statistics with upstream's Prometheus names: the statsd
//! counters `ratelimit.service.rate_limit.<domain>.<key1>[.<key2>...].<stat>`
//! as upstream's `default_mapper.yaml` maps them, to
//! `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`.
//!
//! Keys come from the configuration, except with `value_to_metric` and
//! `detailed_metric`, which put request values in them: the number of
//! series is capped ([`MAX_SERIES`]), and hits of further keys are counted
//! in `ratelimit_service_rate_limit_series_dropped` instead.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// The most distinct stats keys kept.
pub const MAX_SERIES: usize = 10_000;

/// The five per-limit statistics, in upstream's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// Hits counted against the limit.
    TotalHits = 0,
    /// Hits over the limit.
    OverLimit = 1,
    /// Hits past `NEAR_LIMIT_RATIO` of the limit.
    NearLimit = 2,
    /// Hits within the limit.
    WithinLimit = 3,
    /// Hits over a limit in shadow mode.
    ShadowMode = 4,
}

const NAMES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

type Series = Arc<[AtomicU64; 5]>;

/// The statistics of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    series: RwLock<HashMap<String, Series>>,
    dropped: AtomicU64,
    config_load_success: AtomicU64,
    config_load_error: AtomicU64,
}

impl Metrics {
    /// Adds `n` to `stat` of `key`.
    pub fn add(&self, key: &str, stat: Stat, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(s) = self.get(key) {
            // Saturating: a `hits_addend` near 2^64 must not wrap a counter
            // back to a small number (which reads as a counter reset).
            let _ = s[stat as usize].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(n))
            });
        }
    }

    fn get(&self, key: &str) -> Option<Series> {
        if let Some(s) = self
            .series
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return Some(s.clone());
        }
        let mut map = self.series.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = map.get(key) {
            return Some(s.clone());
        }
        if map.len() >= MAX_SERIES {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let s: Series = Arc::default();
        map.insert(key.to_owned(), s.clone());
        Some(s)
    }

    /// The value of `stat` of `key` (0 if never counted).
    pub fn value(&self, key: &str, stat: Stat) -> u64 {
        let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
        map.get(key)
            .map_or(0, |s| s[stat as usize].load(Ordering::Relaxed))
    }

    /// Counts a configuration load.
    pub fn config_loaded(&self, ok: bool) {
        let c = if ok {
            &self.config_load_success
        } else {
            &self.config_load_error
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        let mut out = String::new();
        for (i, name) in NAMES.iter().enumerate() {
            let _ = writeln!(out, "# TYPE ratelimit_service_rate_limit_{name} counter");
            for key in &keys {
                let v = map[*key][i].load(Ordering::Relaxed);
                let _ = writeln!(
                    out,
                    "ratelimit_service_rate_limit_{name}{{{}}} {v}",
                    labels(key)
                );
            }
        }
        for (name, c) in [
            (
                "ratelimit_service_config_load_success",
                &self.config_load_success,
            ),
            (
                "ratelimit_service_config_load_error",
                &self.config_load_error,
            ),
            ("ratelimit_service_rate_limit_series_dropped", &self.dropped),
        ] {
            let _ = writeln!(
                out,
                "# TYPE {name} counter\n{name} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out
    }
}

/// `domain="d",key1="k_v"[,key2="k2"]`: the mapper's labels.
fn labels(key: &str) -> String {
    let mut parts = key.splitn(4, '.');
    let mut out = format!("domain=\"{}\"", escape(parts.next().unwrap_or("")));
    if let Some(k1) = parts.next() {
        let _ = write!(out, ",key1=\"{}\"", escape(k1));
    }
    if let Some(k2) = parts.next() {
        let _ = write!(out, ",key2=\"{}\"", escape(k2));
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_upstream_names_and_labels() {
        let m = Metrics::default();
        m.add("mongo_cps.database_users", Stat::TotalHits, 3);
        m.add("d.k_v.k2_\"x\"", Stat::OverLimit, 1);
        let text = m.render();
        assert!(text.contains("ratelimit_service_rate_limit_total_hits{domain=\"mongo_cps\",key1=\"database_users\"} 3"), "{text}");
        assert!(text.contains("ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"k_v\",key2=\"k2_\\\"x\\\"\"} 1"), "{text}");
    }

    #[test]
    fn series_are_capped() {
        let m = Metrics::default();
        for i in 0..MAX_SERIES + 5 {
            m.add(&format!("d.k_{i}"), Stat::TotalHits, 1);
        }
        assert_eq!(m.series.read().unwrap().len(), MAX_SERIES);
        assert!(m
            .render()
            .contains("ratelimit_service_rate_limit_series_dropped 5"));
    }
}
