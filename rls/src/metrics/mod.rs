//! Per-limit statistics with upstream's Prometheus names: the statsd
//! counters `ratelimit.service.rate_limit.<domain>.<key1>[.<key2>...].<stat>`
//! as upstream's `default_mapper.yaml` maps them, to
//! `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`.
//!
//! Keys come from the configuration, except with `value_to_metric` and
//! `detailed_metric`, which put request values in them: the number of
//! series is capped ([`MAX_SERIES`]), and hits of further keys are counted
//! in `ratelimit_service_rate_limit_series_dropped` instead.
//!
//! Keys are sanitized as upstream's `SanitizeStatName` does before they
//! become statsd names (`:` and `|` to `_`, the dots of an IPv4 address to
//! `_`), so a value holding an address stays one label. With
//! `PROMETHEUS_MAPPER_YAML` the statsd names go through that file
//! ([`mapper`]) instead of the default mapping. The same counters go to
//! statsd ([`Metrics::statsd_counters`]).

pub mod mapper;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use mapper::{Mapped, Mapper};

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
#[derive(Default)]
pub struct Metrics {
    series: RwLock<HashMap<String, Series>>,
    dropped: AtomicU64,
    config_load_success: AtomicU64,
    config_load_error: AtomicU64,
    mapper: Option<Mapper>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("mapper", &self.mapper.is_some())
            .finish_non_exhaustive()
    }
}

/// Upstream's `SanitizeStatName`: `:` and `|` become `_`, and so do the
/// dots of anything shaped like an IPv4 address (`\d{1,3}(\.\d{1,3}){3}`).
pub fn sanitize(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let digits = |s: &[u8], at: usize| {
        s[at..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut i = 0;
    while i < out.len() {
        // The leftmost match, each group taking up to three digits, as
        // Go's regexp prefers.
        let mut at = i;
        let mut dots = Vec::new();
        let mut ok = true;
        for group in 0..4 {
            let n = digits(&out, at);
            if n == 0 {
                ok = false;
                break;
            }
            at += n;
            if group < 3 {
                if out.get(at) != Some(&b'.') {
                    ok = false;
                    break;
                }
                dots.push(at);
                at += 1;
            }
        }
        if ok {
            for d in dots {
                out[d] = b'_';
            }
            i = at;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl Metrics {
    /// Statistics named by a statsd_exporter mapping file.
    pub fn with_mapper_file(path: &std::path::Path) -> Result<Metrics, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "PROMETHEUS_MAPPER_YAML: cannot read {}: {e}",
                path.display()
            )
        })?;
        let mapper = Mapper::parse(&text)
            .map_err(|e| format!("PROMETHEUS_MAPPER_YAML: {}: {e}", path.display()))?;
        Ok(Metrics {
            mapper: Some(mapper),
            ..Metrics::default()
        })
    }

    /// Every counter by its upstream statsd name, with its total so far:
    /// `ratelimit.service.rate_limit.<key>.<stat>` and
    /// `ratelimit.service.config_load_{success,error}`.
    pub fn statsd_counters(&self) -> Vec<(String, u64)> {
        let map = self.series.read().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::with_capacity(map.len() * NAMES.len() + 2);
        for (key, series) in map.iter() {
            let key = sanitize(key);
            for (i, name) in NAMES.iter().enumerate() {
                out.push((
                    format!("ratelimit.service.rate_limit.{key}.{name}"),
                    series[i].load(Ordering::Relaxed),
                ));
            }
        }
        for (name, c) in [
            ("config_load_success", &self.config_load_success),
            ("config_load_error", &self.config_load_error),
        ] {
            out.push((
                format!("ratelimit.service.{name}"),
                c.load(Ordering::Relaxed),
            ));
        }
        out
    }

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
        if let Some(mapper) = &self.mapper {
            return self.render_mapped(mapper);
        }
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
                    labels(&sanitize(key))
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

impl Metrics {
    /// Through a mapping file: counters that map to one name and labels
    /// are summed, as statsd_exporter adds them up.
    fn render_mapped(&self, mapper: &Mapper) -> String {
        let mut metrics: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (statsd, value) in self.statsd_counters() {
            let Mapped::Metric(name, labels) = mapper.map(&statsd) else {
                continue;
            };
            let labels = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect::<Vec<_>>()
                .join(",");
            let sum = metrics.entry(name).or_default().entry(labels).or_default();
            *sum = sum.saturating_add(value);
        }
        let mut out = String::new();
        for (name, series) in &metrics {
            let _ = writeln!(out, "# TYPE {name} counter");
            for (labels, v) in series {
                if labels.is_empty() {
                    let _ = writeln!(out, "{name} {v}");
                } else {
                    let _ = writeln!(out, "{name}{{{labels}}} {v}");
                }
            }
        }
        let name = "ratelimit_service_rate_limit_series_dropped";
        let dropped = self.dropped.load(Ordering::Relaxed);
        let _ = writeln!(out, "# TYPE {name} counter\n{name} {dropped}");
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
    fn stat_names_are_sanitized_as_upstream() {
        assert_eq!(sanitize("d.ip_10.0.0.1:80|x"), "d.ip_10_0_0_1_80_x");
        assert_eq!(sanitize("d.v_1.2.3"), "d.v_1.2.3");
        assert_eq!(sanitize("d.v_1234.5.6.7"), "d.v_1234_5_6_7");
        let m = Metrics::default();
        m.add("d.remote_address_192.168.1.20", Stat::OverLimit, 2);
        assert!(m.render().contains(
            "ratelimit_service_rate_limit_over_limit{domain=\"d\",key1=\"remote_address_192_168_1_20\"} 2"
        ));
        assert!(m.statsd_counters().contains(&(
            "ratelimit.service.rate_limit.d.remote_address_192_168_1_20.over_limit".into(),
            2
        )));
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
