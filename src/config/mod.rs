//! Layers described as data: YAML, TOML or JSON read through serde,
//! checked before any traffic, and swapped while the service runs
//! (feature `config`).
//!
//! ```yaml
//! # limits.yaml
//! prefix: ugc
//! key: { header: x-user-id }
//! rules:
//!   - name: reply
//!     policy: { sliding_log: { limit: 5, window: 60s } }
//!   - name: reply-day
//!     policy: { fixed_window: { limit: 200, window: 1d } }
//! lockout: { strikes: 3, within: 10m, lock: 1h }
//! ```
//!
//! Every field is named in [`LayerConfig`]; an unknown one is refused, and
//! so is a value a constructor would refuse (a limit of 0, a duration
//! without a unit, a bad CIDR or header name): the [`ConfigError`] names
//! the file, the line and column, and the field
//! (`limits.yaml:5:30: rules[0].policy.sliding_log.limit: …`). Durations are
//! whole numbers with a unit: `500ms`, `60s`, `15m`, `1h`, `1d`.
//!
//! # Every builder option, and its file form
//!
//! A file says everything the builder says that is data; what is code (a
//! closure, a type) has a file form through a name the application
//! registers ([`Extractors`]), or none. A test fails when a builder option
//! is added without a row here.
//!
//! | Builder | File | |
//! |---|---|---|
//! | `ThrottleLayer::new` | `rules[0]` | the first rule |
//! | `and` | `rules[1..]` | more rules, all or nothing |
//! | `name` | `rules[i].name` | |
//! | `prefix` | `prefix` | a route's defaults to its name |
//! | `key` | `key`, `rules[i].key` | `peer_ip`, `{ header: .. }`, `{ extractor: .. }`, … |
//! | `cost` | `rules[i].cost: 2` | |
//! | `cost_fn` | `rules[i].cost: { header \| query: .., default: .. }` | a closure otherwise: none |
//! | `settle_cost` | `rules[i].settle` | `reported`, `response_bytes`, `{ trailer: .. }` |
//! | `quota_unit` | `rules[i].quota_unit` | `requests`, `content-bytes`, `concurrent-requests` |
//! | `policy_fn` | `rules[i].tiers` | a policy per value of a key |
//! | `policy_from_extension` | `rules[i].tiers.by: { extractor: .. }` | |
//! | `resolver` | none | code (a database, a cache) |
//! | `skip_if` | `skip: { paths, methods }` | nothing a client sets at will |
//! | `count_if` | `count_if: { http: [..] }` | statuses and classes (`5xx`) |
//! | `count_if_outcome` | `count_if: { grpc: [..] }` | gRPC codes by name |
//! | `lockout` | `lockout` | |
//! | `mode`, `delay_up_to`, `dry_run` | `mode` | `reject`, `dry_run`, `{ delay_up_to: .. }` |
//! | `near_limit_ratio` | `near_limit_ratio` | 0 to 1 |
//! | `fail_mode`, `fail_open`, `fail_closed` | `on_store_failure` | `closed`, `open` |
//! | `store_timeout` | `store_timeout` | above 0 |
//! | `on_missing_key` | `on_missing_key` | `skip`, `{ reject: 401 }` |
//! | `headers_on_allowed` | `headers_on_allowed` | |
//! | `request_info` | `request_info` | |
//! | `ietf_headers` | `ietf_headers` | |
//! | `field_profile` | `field_profile` | `draft10`, `draft11` |
//! | `partition_keys` | none | a secret belongs in a secret store, not a limits file |
//! | `legacy_headers` | `legacy_headers` | |
//! | `legacy_reset_format` | `legacy_reset_format` | `seconds`, `unix_timestamp` |
//! | `plain_text_body`, `problem_json_body` | `body` | `plain_text`, `problem_json` |
//! | `custom_response` | none | code |
//! | `share_counters` | `share_counters` | |
//!
//! [`LayerConfig::layer`] builds a [`ThrottleLayer`](crate::ThrottleLayer) from the file and
//! asks the store whether it can run it (what a store refuses is an error
//! here, naming the rule, never a 503 later). [`RuleTable`] keeps one
//! that can be replaced at run time: see [`RuleTable::reload`].
//!
//! ```
//! use tower_throttle::config::{LayerConfig, RuleTable};
//! use tower_throttle::MemoryStore;
//!
//! let config = LayerConfig::parse(
//!     "limits.yaml",
//!     "rules: [{ name: reply, policy: { sliding_log: { limit: 5, window: 60s } } }]",
//! )?;
//! let table = RuleTable::new(MemoryStore::new(), config)?;
//! let layer = table.layer("default")?; // a file of one layer is the route `default`
//! // Later, when the file changes:
//! table.reload(LayerConfig::parse(
//!     "limits.yaml",
//!     "rules: [{ name: reply, policy: { sliding_log: { limit: 3, window: 60s } } }]",
//! )?)?;
//! # let _ = layer;
//! # Ok::<(), tower_throttle::config::ConfigError>(())
//! ```

use std::path::Path;

use serde::de::DeserializeOwned;

mod answer;
mod behaviour;
mod build;
mod cost;
mod duration;
mod error;
mod extractors;
mod key;
mod policy;
mod reload;
mod service;
mod spec;
mod tiers;
mod watch;

pub use answer::{
    BodyConfig, FieldProfileConfig, OnMissingKeyConfig, QuotaUnitConfig, ResetFormatConfig,
};
pub use behaviour::{CountIfConfig, GrpcCodeConfig, SkipConfig, StatusMatch};
pub use cost::{CostConfig, SettleConfig};
pub use error::ConfigError;
pub use extractors::Extractors;
pub use key::{ClientIpConfig, KeyConfig};
pub use policy::PolicyConfig;
pub use reload::{ReloadLayer, ReloadService, RuleTable};
pub use service::{ServiceConfig, DEFAULT_ROUTE};
pub use spec::{FailConfig, LayerConfig, LockoutConfig, ModeConfig, RuleConfig};
pub use tiers::TiersConfig;
pub use watch::{FileWatch, WatchHandle, WatchOutcome, DEFAULT_WATCH_INTERVAL};

/// The formats a layer file may be in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// YAML (`.yaml`, `.yml`).
    Yaml,
    /// TOML (`.toml`).
    Toml,
    /// JSON (`.json`).
    Json,
}

impl Format {
    /// The format a file name's extension says; `None` for another one.
    pub fn of_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

impl LayerConfig {
    /// Reads and checks the file at `path`, in the format its extension
    /// names (`.yaml`/`.yml`, `.toml`, `.json`).
    pub fn from_path(path: impl AsRef<Path>) -> Result<LayerConfig, ConfigError> {
        let (source, text, format) = read_file(path.as_ref())?;
        Self::parse_as(&source, &text, format)
    }

    /// Checks YAML text (JSON is YAML too); `source` names it in errors.
    pub fn parse(source: &str, text: &str) -> Result<LayerConfig, ConfigError> {
        Self::parse_as(source, text, Format::Yaml)
    }

    /// Checks text in `format`; `source` names it in errors.
    pub fn parse_as(source: &str, text: &str, format: Format) -> Result<LayerConfig, ConfigError> {
        read(source, text, format)
    }
}

/// A file's name (for errors), text and format.
fn read_file(path: &Path) -> Result<(String, String, Format), ConfigError> {
    let source = path.display().to_string();
    let format = Format::of_path(path).ok_or_else(|| {
        ConfigError::new(&source, "the file must end in .yaml, .yml, .toml or .json")
    })?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(&source, format!("cannot be read: {e}")))?;
    Ok((source, text, format))
}

/// Reads `text` in `format` as a `T`; `source` names it in errors.
fn read<T: DeserializeOwned>(source: &str, text: &str, format: Format) -> Result<T, ConfigError> {
    match format {
        Format::Yaml => read_yaml(source, text),
        Format::Toml => read_toml(source, text),
        Format::Json => read_json(source, text),
    }
}

/// The field path of a failed read (`.` when at the top).
fn field_of<E>(e: &serde_path_to_error::Error<E>) -> String {
    e.path().to_string()
}

/// The message without the location suffix (` at line 3 column 7`) that
/// the YAML and JSON readers append: the error has its own fields for it.
fn bare(message: String) -> String {
    match message.rfind(" at line ") {
        Some(at) if message[at..].contains(" column ") => message[..at].to_owned(),
        _ => message,
    }
}

fn read_yaml<T: DeserializeOwned>(source: &str, text: &str) -> Result<T, ConfigError> {
    let de = yaml_serde::Deserializer::from_str(text);
    let mut track = serde_path_to_error::Track::new();
    // One-key maps for enums (`{ sliding_log: {..} }`), as in JSON and
    // TOML, rather than YAML tags (`!sliding_log {..}`).
    let tracked = serde_path_to_error::Deserializer::new(de, &mut track);
    yaml_serde::with::singleton_map_recursive::deserialize(tracked).map_err(|inner| {
        let field = track.path().to_string();
        let mut error = ConfigError::new(source, yaml_message(&inner));
        if let Some(at) = inner.location() {
            let (line, column) = yaml_place(text, at.line(), at.column(), &field);
            error = error.at(line, column);
        }
        error.at_field(field)
    })
}

/// yaml_serde puts the path of the value before its message (`rules[0]:
/// …`); the error has its own field for it.
fn yaml_message(e: &yaml_serde::Error) -> String {
    let message = bare(e.to_string());
    match message.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => rest.to_owned(),
        _ => message,
    }
}

fn read_toml<T: DeserializeOwned>(source: &str, text: &str) -> Result<T, ConfigError> {
    let located = |message: &str, span: Option<std::ops::Range<usize>>| {
        let mut error = ConfigError::new(source, message.trim_end());
        if let Some(span) = span {
            let (line, column) = line_column(text, span.start);
            error = error.at(line, column);
        }
        error
    };
    let de = toml::Deserializer::parse(text).map_err(|e| located(e.message(), e.span()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = field_of(&e);
        let inner = e.into_inner();
        located(inner.message(), inner.span()).at_field(field)
    })
}

fn read_json<T: DeserializeOwned>(source: &str, text: &str) -> Result<T, ConfigError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let config: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = field_of(&e);
        let inner = e.into_inner();
        ConfigError::new(source, bare(inner.to_string()))
            .at_field(field)
            .at(inner.line(), inner.column())
    })?;
    de.end()
        .map_err(|e| ConfigError::new(source, bare(e.to_string())).at(e.line(), e.column()))?;
    Ok(config)
}

/// Where in a YAML file the field at fault is. The reader places an error
/// raised while checking a value at the event before it (often the
/// previous key of the mapping), so when that line does not hold the
/// field's key, the key is looked for on the lines that follow.
fn yaml_place(text: &str, line: usize, column: usize, field: &str) -> (usize, usize) {
    let key = field
        .rsplit('.')
        .next()
        .map(|last| last.split('[').next().unwrap_or(last))
        .filter(|key| !key.is_empty() && *key != "?");
    let Some(key) = key else {
        return (line, column);
    };
    let at_key = |text: &str| {
        text.match_indices(key).find_map(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + key.len()..].trim_start().starts_with(':');
            let starts = before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
            (after && starts).then_some(i)
        })
    };
    let lines = text
        .lines()
        .enumerate()
        .skip(line.saturating_sub(1))
        .take(64);
    for (i, this) in lines {
        if let Some(at) = at_key(this) {
            return (i + 1, at + 1);
        }
    }
    (line, column)
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
