//! `LOG_FORMAT` and `LOG_LEVEL`, with upstream's (logrus) level names.

use super::{Env, SettingsError};

/// The log level as given, and whether logs are JSON.
pub(super) fn logs(env: &Env<'_>) -> Result<(String, bool), SettingsError> {
    let log_format = env.string("LOG_FORMAT", "text");
    if !matches!(log_format.as_str(), "text" | "json") {
        return Err(SettingsError::invalid(
            "LOG_FORMAT",
            &log_format,
            "expected text or json",
        ));
    }
    let log_level = env.string("LOG_LEVEL", "WARN");
    if !matches!(
        log_level.to_ascii_lowercase().as_str(),
        "trace" | "debug" | "info" | "warn" | "warning" | "error" | "fatal" | "panic"
    ) {
        return Err(SettingsError::invalid(
            "LOG_LEVEL",
            &log_level,
            "expected DEBUG, INFO, WARN or ERROR",
        ));
    }
    Ok((log_level, log_format == "json"))
}
