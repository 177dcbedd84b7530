//! A configuration error: where (file, line, field) and what.

use std::fmt;

/// Why a layer file was refused: the file, the line and column when the
/// format says, the field (as a path such as `rules[1].policy.sliding_log.limit`),
/// and the reason. A refused reload leaves the running table as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or the name given to [`LayerConfig::parse`](super::LayerConfig::parse)).
    pub source: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The field at fault (`.` for the whole file), when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    pub(super) fn new(source: &str, message: impl Into<String>) -> Self {
        ConfigError {
            source: source.to_owned(),
            line: None,
            column: None,
            field: None,
            message: message.into(),
        }
    }

    pub(super) fn at_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub(super) fn at(mut self, line: usize, column: usize) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}
