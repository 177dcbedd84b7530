//! The configuration: every `*.yaml` of the config directory, read with
//! upstream's schema (envoyproxy/ratelimit `src/config/config_impl.go`) and
//! its load errors, each naming the file, the line and the field.
//!
//! Extension keys, inside `rate_limit` only: `algorithm: fixed_window |
//! sliding_window | sliding_log | gcra` and `burst:` (GCRA). A file using
//! them no longer loads in upstream's server; `RLS_STRICT_UPSTREAM_KEYS=true`
//! refuses them here too.

mod model;
mod rate_limit;
mod table;
mod values;
mod yaml;

use std::fmt;
use std::path::Path;

pub use model::{Algorithm, Limit, Unit};
pub use table::{Node, Table};

use serde::de::DeserializeSeed;

/// How to load.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// `MERGE_DOMAIN_CONFIG`: one domain in several files is merged.
    pub merge_domains: bool,
    /// `RLS_STRICT_UPSTREAM_KEYS`: refuse the extension keys.
    pub strict_upstream_keys: bool,
    /// `RUNTIME_IGNOREDOTFILES`: skip files whose name starts with `.`.
    pub ignore_dotfiles: bool,
}

/// Why a configuration was refused: the file, the line and column when
/// known, the field path (`descriptors[0].rate_limit`), and upstream's
/// message. The whole load is refused; a running server keeps its table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as `config/<name>.yaml` (or the directory).
    pub file: String,
    /// 1-based line and column.
    pub line: Option<(usize, usize)>,
    /// The field path, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some((line, column)) = self.line {
            write!(f, ":{line}:{column}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Parses one file's text into `table` (`name` is how errors cite it).
pub fn add_file(
    table: &mut Table,
    name: &str,
    text: &str,
    options: LoadOptions,
) -> Result<(), ConfigError> {
    let seed = yaml::Root(yaml::Options {
        strict: options.strict_upstream_keys,
    });
    let root = yaml_serde::Deserializer::from_str(text)
        .next()
        .map_or(Ok(yaml::RawRoot::default()), |doc| seed.deserialize(doc))
        .map_err(|e| from_yaml(name, &e))?;
    if root.domain.is_empty() {
        return Err(plain(name, "config file cannot have empty domain"));
    }
    let domain_line = text
        .lines()
        .position(|l| l.trim_start().starts_with("domain:"))
        .map(|i| (i + 1, 1));
    table
        .add(root, options.merge_domains)
        .map_err(|message| ConfigError {
            line: domain_line,
            ..plain(name, &message)
        })
}

/// Loads every `*.yaml` of `dir` (sorted by name, as upstream's runtime
/// loader lists them). A missing directory is an empty table.
pub fn load_dir(dir: &Path, options: LoadOptions) -> Result<Table, ConfigError> {
    let mut table = Table::default();
    for (name, text) in read_dir(dir, options)? {
        add_file(&mut table, &name, &text, options)?;
    }
    Ok(table)
}

/// The `(config/<file>, text)` pairs of `dir`; used by the reloader to see
/// changes too.
pub fn read_dir(dir: &Path, options: LoadOptions) -> Result<Vec<(String, String)>, ConfigError> {
    let shown = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(plain(
                &dir.display().to_string(),
                &format!("cannot read the directory: {e}"),
            ))
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| plain(&shown, &format!("cannot list the directory: {e}")))?;
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !file_name.ends_with(".yaml")
            || (options.ignore_dotfiles && file_name.starts_with('.'))
            || path.is_dir()
        {
            continue;
        }
        let name = format!("{shown}/{file_name}");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| plain(&name, &format!("error loading config file: {e}")))?;
        files.push((name, text));
    }
    files.sort();
    Ok(files)
}

fn plain(file: &str, message: &str) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line: None,
        field: None,
        message: message.to_owned(),
    }
}

/// A yaml_serde error as `file:line:col: field: message`.
fn from_yaml(file: &str, e: &yaml_serde::Error) -> ConfigError {
    let text = e.to_string();
    // yaml_serde writes `path: message at line L column C`.
    let text = text
        .rfind(" at line ")
        .map_or(text.as_str(), |i| &text[..i]);
    let (field, message) = match text.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => (Some(path.to_owned()), rest.to_owned()),
        _ => (None, text.to_owned()),
    };
    ConfigError {
        file: file.to_owned(),
        line: e.location().map(|l| (l.line(), l.column())),
        field,
        message,
    }
}

#[cfg(test)]
mod tests;
