//! The stats sinks, as upstream picks one (`src/service_cmd/runner/runner.go`):
//! `DISABLE_STATS`, `USE_STATSD` (upstream's default), `USE_PROMETHEUS`.

use std::time::Duration;

use super::{Env, SettingsError};

/// Statsd counters sent every `STATS_FLUSH_INTERVAL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statsd {
    /// `STATSD_HOST` (default `localhost`).
    pub host: String,
    /// `STATSD_PORT` (default 8125).
    pub port: u16,
    /// `STATSD_PROTOCOL` is `tcp` (the default of upstream's statsd
    /// library, lyft/gostats), else UDP.
    pub tcp: bool,
    /// `STATS_FLUSH_INTERVAL` (default 10s).
    pub flush_interval: Duration,
}

/// `USE_STATSD`: on by default, as upstream; off with `DISABLE_STATS=true`
/// or when `USE_PROMETHEUS=true` leaves it unset (upstream refuses to start
/// with both on, so a working upstream deployment sets it false there).
pub(super) fn statsd(
    env: &Env<'_>,
    prometheus: bool,
    disabled: bool,
) -> Result<Option<Statsd>, SettingsError> {
    let explicit = (env.0)("USE_STATSD").is_some();
    let on = env.flag("USE_STATSD", true)?;
    if disabled || !on || (prometheus && !explicit) {
        return Ok(None);
    }
    if prometheus {
        return Err(SettingsError {
            name: "USE_STATSD",
            message: "USE_STATSD=true with USE_PROMETHEUS=true: one stats sink at a time, \
                      as upstream (set USE_STATSD=false)"
                .into(),
        });
    }
    let protocol = env.string("STATSD_PROTOCOL", "tcp");
    let tcp = match protocol.as_str() {
        "tcp" | "tcp4" | "tcp6" => true,
        "udp" | "udp4" | "udp6" => false,
        other => {
            return Err(SettingsError::invalid(
                "STATSD_PROTOCOL",
                other,
                "expected tcp or udp",
            ))
        }
    };
    let flush_interval = env.duration("STATS_FLUSH_INTERVAL", Duration::from_secs(10))?;
    if flush_interval.is_zero() {
        return Err(SettingsError::invalid(
            "STATS_FLUSH_INTERVAL",
            "0",
            "expected a duration above zero",
        ));
    }
    Ok(Some(Statsd {
        host: env.string("STATSD_HOST", "localhost"),
        port: match env.port("STATSD_PORT", 8125)? {
            // A destination, not a listener: no port picks itself.
            0 => {
                return Err(SettingsError::invalid(
                    "STATSD_PORT",
                    "0",
                    "expected a port from 1",
                ))
            }
            port => port,
        },
        tcp,
        flush_interval,
    }))
}

/// `EXTRA_TAGS` would put tags into every stat name; not supported, so a
/// value is refused rather than dropped.
pub(super) fn refuse_extra_tags(env: &Env<'_>) -> Result<(), SettingsError> {
    match (env.0)("EXTRA_TAGS") {
        Some(tags) if !tags.trim().is_empty() => Err(SettingsError::unsupported(
            "EXTRA_TAGS",
            "tags on stat names",
        )),
        _ => Ok(()),
    }
}

/// `USE_PROMETHEUS` (unless `DISABLE_STATS`): the listener address
/// (`PROMETHEUS_ADDR`, `:port` on every interface) and `PROMETHEUS_PATH`.
pub(super) fn prometheus(
    env: &Env<'_>,
    disable_stats: bool,
) -> Result<Option<(String, String)>, SettingsError> {
    if disable_stats || !env.flag("USE_PROMETHEUS", false)? {
        return Ok(None);
    }
    let addr = env.string("PROMETHEUS_ADDR", ":9090");
    let addr = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr
    };
    let path = env.string("PROMETHEUS_PATH", "/metrics");
    if !path.starts_with('/') {
        return Err(SettingsError::invalid(
            "PROMETHEUS_PATH",
            &path,
            "expected a path starting with /",
        ));
    }
    Ok(Some((addr, path)))
}
