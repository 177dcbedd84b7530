//! `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file, applied to the
//! statsd names of the counters as upstream's Prometheus sink applies it
//! (statsd_exporter's `pkg/mapper`):
//!
//! * `glob` mappings (the default `match_type`) first: the name and the
//!   pattern have the same number of `.`-separated fields, each field equal
//!   or `*`; the first such mapping in the file wins; `$1`, `${1}` in
//!   `name` and `labels` are the fields `*` matched;
//! * then `regex` mappings in file order, unanchored, `$1`/`${name}`
//!   expanded from the groups;
//! * `action: drop` drops the counter; `match_metric_type` other than
//!   `counter` never matches (every statistic here is a counter);
//! * an unmatched name is the statsd name with every character outside
//!   `[a-zA-Z0-9_]` made `_` (a digit first gets a `_` before it).
//!
//! Histogram, summary and TTL options are accepted and unused (there are
//! no timers here).

use std::collections::BTreeMap;

use regex::{Captures, Regex};
use serde::Deserialize;

#[derive(Deserialize, Default)]
struct RawDefaults {
    #[serde(default)]
    match_type: String,
}

#[derive(Deserialize)]
struct RawFile {
    #[serde(default)]
    defaults: RawDefaults,
    #[serde(default)]
    mappings: Vec<RawMapping>,
}

#[derive(Deserialize)]
struct RawMapping {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    match_type: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    action: String,
    #[serde(default)]
    match_metric_type: String,
}

enum Matcher {
    Glob(Vec<String>),
    Regex(Regex),
}

struct Mapping {
    matcher: Matcher,
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
    counters: bool,
}

/// A parsed mapping file.
pub struct Mapper {
    mappings: Vec<Mapping>,
    template: Regex,
}

/// What a statsd name becomes.
#[derive(Debug, PartialEq, Eq)]
pub enum Mapped {
    /// `action: drop`.
    Drop,
    /// A Prometheus name and its labels, sorted by label name.
    Metric(String, Vec<(String, String)>),
}

fn glob_field_ok(field: &str, first: bool) -> bool {
    field == "*"
        || (!field.is_empty()
            && field
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            && !(first && field.starts_with(|c: char| c.is_ascii_digit() || c == '-')))
}

fn label_ok(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// statsd_exporter's `EscapeMetricName`.
pub fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous = '\0';
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !(c == '-' && previous == '-') {
            out.push('_');
        }
        previous = c;
    }
    out
}

impl Mapper {
    /// Parses a mapping file; an error says which mapping and why.
    pub fn parse(text: &str) -> Result<Mapper, String> {
        let raw: RawFile = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
        let mut mappings = Vec::with_capacity(raw.mappings.len());
        for (i, m) in raw.mappings.into_iter().enumerate() {
            let bad = |why: String| format!("mapping {i} ({:?}): {why}", m.pattern);
            if m.name.is_empty() {
                return Err(bad("no metric name".into()));
            }
            if let Some((k, _)) = m.labels.iter().find(|(k, _)| !label_ok(k)) {
                return Err(bad(format!("invalid label name {k:?}")));
            }
            let kind = if m.match_type.is_empty() {
                raw.defaults.match_type.as_str()
            } else {
                m.match_type.as_str()
            };
            let matcher = match kind {
                "" | "glob" => {
                    let fields: Vec<String> = m.pattern.split('.').map(str::to_owned).collect();
                    if !fields
                        .iter()
                        .enumerate()
                        .all(|(i, f)| glob_field_ok(f, i == 0))
                    {
                        return Err(bad("invalid glob match".into()));
                    }
                    Matcher::Glob(fields)
                }
                "regex" => Matcher::Regex(
                    Regex::new(&m.pattern).map_err(|e| bad(format!("invalid regex: {e}")))?,
                ),
                other => return Err(bad(format!("unknown match_type {other:?}"))),
            };
            let drop = match m.action.as_str() {
                "" | "map" => false,
                "drop" => true,
                other => return Err(bad(format!("unknown action {other:?}"))),
            };
            mappings.push(Mapping {
                matcher,
                name: m.name,
                labels: m.labels.into_iter().collect(),
                drop,
                counters: matches!(m.match_metric_type.as_str(), "" | "counter"),
            });
        }
        Ok(Mapper {
            mappings,
            template: Regex::new(r"\$\{?([a-zA-Z0-9_$]+)\}?").map_err(|e| e.to_string())?,
        })
    }

    /// What the counter named `statsd` becomes.
    pub fn map(&self, statsd: &str) -> Mapped {
        let fields: Vec<&str> = statsd.split('.').collect();
        for m in self.mappings.iter().filter(|m| m.counters) {
            let Matcher::Glob(pattern) = &m.matcher else {
                continue;
            };
            if pattern.len() != fields.len()
                || !pattern.iter().zip(&fields).all(|(p, f)| p == "*" || p == f)
            {
                continue;
            }
            let captures: Vec<&str> = pattern
                .iter()
                .zip(&fields)
                .filter(|(p, _)| *p == "*")
                .map(|(_, f)| *f)
                .collect();
            let fill = |t: &str| self.glob_template(t, &captures);
            return self.result(m, fill);
        }
        for m in &self.mappings {
            let Matcher::Regex(re) = &m.matcher else {
                continue;
            };
            let Some(caps) = re.captures(statsd) else {
                continue;
            };
            if !m.counters {
                continue;
            }
            let fill = |t: &str| expand(&caps, t);
            return self.result(m, fill);
        }
        Mapped::Metric(escape(statsd), Vec::new())
    }

    fn result(&self, m: &Mapping, fill: impl Fn(&str) -> String) -> Mapped {
        if m.drop {
            return Mapped::Drop;
        }
        let labels = m.labels.iter().map(|(k, v)| (k.clone(), fill(v))).collect();
        Mapped::Metric(escape(&fill(&m.name)), labels)
    }

    /// statsd_exporter's glob templates: `$n` / `${n}` for the n-th `*`,
    /// any other reference empty.
    fn glob_template(&self, template: &str, captures: &[&str]) -> String {
        self.template
            .replace_all(template, |c: &Captures<'_>| {
                c[1].parse::<usize>()
                    .ok()
                    .filter(|n| (1..=captures.len()).contains(n))
                    .map_or_else(String::new, |n| captures[n - 1].to_owned())
            })
            .into_owned()
    }
}

fn expand(caps: &Captures<'_>, template: &str) -> String {
    let mut out = String::new();
    caps.expand(template, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "${2}", none: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^.]*)\\.([^.]*)\\.([^.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "hits_deep"
    labels: {domain: "$1", key2: "$3"}
  - match: "ratelimit.service.config_load_error"
    name: "x"
    action: drop
  - match: "ratelimit.service.config_load_success"
    name: "loads"
    match_metric_type: gauge
"#;

    #[test]
    fn globs_then_regexes_then_escaped_names() {
        let m = Mapper::parse(FILE).unwrap();
        let l = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        assert_eq!(
            m.map("ratelimit.service.rate_limit.d.k_v.total_hits"),
            Mapped::Metric(
                "hits".into(),
                l(&[("domain", "d"), ("key1", "k_v"), ("none", "")])
            )
        );
        assert_eq!(
            m.map("ratelimit.service.rate_limit.d.a_1.b_2.c.total_hits"),
            Mapped::Metric("hits_deep".into(), l(&[("domain", "d"), ("key2", "b_2")]))
        );
        assert_eq!(m.map("ratelimit.service.config_load_error"), Mapped::Drop);
        // A gauge mapping does not take a counter: the escaped name.
        assert_eq!(
            m.map("ratelimit.service.config_load_success"),
            Mapped::Metric("ratelimit_service_config_load_success".into(), vec![])
        );
        assert_eq!(escape("9a.b-c--d"), "_9a_b_c_d");
    }

    #[test]
    fn bad_files_say_which_mapping() {
        for (text, says) in [
            ("mappings:\n  - match: a.b\n", "no metric name"),
            ("mappings:\n  - match: a..b\n    name: x\n", "invalid glob"),
            (
                "mappings:\n  - match: '('\n    match_type: regex\n    name: x\n",
                "invalid regex",
            ),
            (
                "mappings:\n  - match: a\n    name: x\n    labels: {'1x': y}\n",
                "label",
            ),
        ] {
            let err = Mapper::parse(text).err().unwrap();
            assert!(err.contains(says), "{err}");
        }
    }
}
