//! What the server says when it starts: one line with the backend, the
//! configuration source, the domains and limits loaded, and the listeners
//! (logged at INFO on [`START_TARGET`], which the default `LOG_LEVEL=WARN`
//! still shows); then a warning for a missing or empty configuration and
//! one for each upstream setting that changes nothing here.

use std::fmt::Write as _;

use super::Running;
use crate::settings::{Backend, RedisType, Settings, XdsSettings};

/// The target of the start and shutdown lines.
pub const START_TARGET: &str = "throttle_rls::start";

/// At most this many domain names in the start line.
const DOMAINS_SHOWN: usize = 10;

/// `user:password@` in a URL, hidden.
fn redact(urls: &str) -> String {
    urls.split(',')
        .map(|part| match part.rfind('@') {
            Some(at) => {
                let start = part.find("://").map_or(0, |i| i + 3);
                format!("{}<redacted>@{}", &part[..start], &part[at + 1..])
            }
            None => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The backend, and what happens while it is down.
pub(super) fn backend(settings: &Settings) -> String {
    match &settings.backend {
        Backend::Memory => format!(
            "memory (per process, not shared between replicas: each replica counts alone; \
             at most {} keys)",
            settings.memory_max_keys
        ),
        Backend::Redis(r) => {
            let kind = match r.redis_type {
                RedisType::Single => "SINGLE",
                RedisType::Sentinel => "SENTINEL",
                RedisType::Cluster => "CLUSTER",
            };
            let mut out = format!("Redis {kind} at {} ({}", redact(&r.url), r.socket_type);
            if r.tls || r.url.contains("rediss://") {
                out.push_str(", TLS");
                if r.tls_client.is_some() {
                    out.push_str(" with a client certificate");
                }
            }
            out.push(')');
            out.push_str(if r.fallback_to_memory {
                "; while Redis is down a per-process memory store decides (RLS_REDIS_FALLBACK=memory)"
            } else {
                "; while Redis is down calls are answered UNAVAILABLE and health fails"
            });
            out.push_str(settings.leases.describe());
            out
        }
    }
}

/// Where the configuration comes from and what was loaded; and a warning
/// when nothing was.
fn configuration(settings: &Settings, running: &Running) -> (String, Option<String>) {
    if let Some(xds) = &settings.xds {
        return from_xds(xds, running);
    }
    let dir = settings.config_dir();
    let when = if settings.runtime_watch_root {
        "when RUNTIME_ROOT is swapped"
    } else {
        "when a file there changes"
    };
    let mut out = format!(
        "files in {} (reloaded {when}, checked every {:?})",
        dir.display(),
        settings.reload_interval
    );
    if let Some(e) = running.limiter.last_error() {
        let _ = write!(out, ": none loaded ({e})");
        let warning = format!(
            "no rate-limit configuration loaded: every request fails until {} holds a valid one",
            dir.display()
        );
        return (out, Some(warning));
    }
    let table = running.limiter.table();
    let (domains, limits) = table.as_deref().map(|t| t.summary()).unwrap_or_default();
    if domains.is_empty() {
        let why = if dir.is_dir() {
            "has no *.yaml file with a domain"
        } else {
            "does not exist"
        };
        let warning = format!(
            "no rate-limit configuration: {} {why}; every request is answered OK without \
             a limit until files appear there",
            dir.display()
        );
        out.push_str(": no domain");
        return (out, Some(warning));
    }
    out.push_str(&loaded(&domains, limits));
    (out, None)
}

/// The xDS server, and what it sent so far.
fn from_xds(xds: &XdsSettings, running: &Running) -> (String, Option<String>) {
    let security = match &xds.tls {
        None => "plain text".to_owned(),
        Some(t) => {
            let mut s = "TLS".to_owned();
            if t.client.is_some() {
                s.push_str(" with a client certificate");
            }
            if let Some(san) = &t.san {
                let _ = write!(s, ", server verified as {san}");
            }
            s
        }
    };
    let mut out = format!(
        "xDS server {} (node id {}, {security})",
        xds.server_url, xds.node_id
    );
    let table = running.limiter.table();
    match (&table, running.limiter.last_error()) {
        (None, Some(e)) => {
            let _ = write!(out, ": none loaded ({e})");
            let warning = "no rate-limit configuration loaded: every request fails until the \
                           xDS server sends a valid one"
                .to_owned();
            return (out, Some(warning));
        }
        (None, None) => {
            out.push_str(": none yet");
            let warning =
                "no rate-limit configuration yet (FORCE_START_WITHOUT_INITIAL_CONFIG=true): \
                           every request fails until the xDS server sends one"
                    .to_owned();
            return (out, Some(warning));
        }
        _ => {}
    }
    let (domains, limits) = table.as_deref().map(|t| t.summary()).unwrap_or_default();
    if domains.is_empty() {
        out.push_str(": no domain");
        return (out, None);
    }
    out.push_str(&loaded(&domains, limits));
    (out, None)
}

/// `: 2 domains (a, b), 3 limits`.
fn loaded(domains: &[&str], limits: usize) -> String {
    let mut shown = domains
        .iter()
        .take(DOMAINS_SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if domains.len() > DOMAINS_SHOWN {
        let _ = write!(shown, ", … {} more", domains.len() - DOMAINS_SHOWN);
    }
    let s = |n: usize| if n == 1 { "" } else { "s" };
    format!(
        ": {} domain{} ({shown}), {limits} limit{}",
        domains.len(),
        s(domains.len()),
        s(limits)
    )
}

/// The listeners and the stats sinks.
fn listeners(settings: &Settings, running: &Running) -> String {
    let grpc = match &settings.grpc_uds {
        Some(path) => format!("unix socket {}", path.display()),
        None => running.grpc_addr.to_string(),
    };
    let security = running
        .tls
        .as_ref()
        .map_or_else(|| "plain text".to_owned(), |t| t.describe());
    let mut out = format!(
        "gRPC {grpc} ({security}); HTTP {} (/json, /healthcheck); debug {} (/rlconfig)",
        running.http_addr, running.debug_addr
    );
    match (&settings.prometheus, running.metrics_addr) {
        (Some((_, path)), Some(addr)) => {
            let _ = write!(out, "; Prometheus {addr}{path}");
            if let Some(mapper) = &settings.prometheus_mapper {
                let _ = write!(out, " named by {}", mapper.display());
            }
        }
        _ => out.push_str("; Prometheus off"),
    }
    match &settings.statsd {
        Some(s) => {
            let protocol = if s.tcp { "tcp" } else { "udp" };
            let _ = write!(
                out,
                "; statsd to {}:{} over {protocol} every {:?}",
                s.host, s.port, s.flush_interval
            );
        }
        None => out.push_str("; statsd off"),
    }
    out
}

/// Logs the start: the summary line, then the warnings.
pub(super) fn started(settings: &Settings, running: &Running) {
    let (config, warning) = configuration(settings, running);
    tracing::info!(
        target: START_TARGET,
        "throttle-rls started: backend {}; configuration {config}; {}",
        backend(settings),
        listeners(settings, running)
    );
    if let Some(w) = warning {
        tracing::warn!(target: START_TARGET, "{w}");
    }
    for notice in &settings.notices {
        tracing::warn!(target: START_TARGET, "{notice}");
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn credentials_in_urls_are_hidden() {
        assert_eq!(redact("10.0.0.1:6379"), "10.0.0.1:6379");
        assert_eq!(
            redact("redis://u:p@h:1,rediss://:x@g:2"),
            "redis://<redacted>@h:1,rediss://<redacted>@g:2"
        );
    }
}
