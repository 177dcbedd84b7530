//! Upstream's `REDIS_URL` forms (`host:port`, a socket path, a comma list
//! of cluster nodes, `master,sentinel,...`) as redis-rs URLs.

use super::BackendError;
use crate::settings::RedisSettings;

/// `user:password` or `password`.
pub(super) fn split_auth(auth: &str) -> (Option<&str>, &str) {
    match auth.split_once(':') {
        Some((user, password)) => (Some(user), password),
        None => (None, auth),
    }
}

fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn userinfo(auth: &str) -> String {
    if auth.is_empty() {
        return String::new();
    }
    match split_auth(auth) {
        (Some(user), password) => format!("{}:{}@", encode(user), encode(password)),
        (None, password) => format!(":{}@", encode(password)),
    }
}

fn tcp(host_port: &str, r: &RedisSettings, auth: &str) -> Result<String, BackendError> {
    let host_port = host_port.trim();
    if host_port.starts_with("redis://")
        || host_port.starts_with("rediss://")
        || host_port.starts_with("redis+unix://")
        || host_port.starts_with("unix://")
    {
        return Ok(host_port.to_owned());
    }
    if !host_port.contains(':') {
        return Err(BackendError(format!(
            "REDIS_URL: expected host:port, got {host_port:?}"
        )));
    }
    let scheme = if r.tls { "rediss" } else { "redis" };
    Ok(format!("{scheme}://{}{host_port}/", userinfo(auth)))
}

/// The one server of `REDIS_TYPE=SINGLE`.
pub(super) fn single(r: &RedisSettings) -> Result<String, BackendError> {
    if r.socket_type == "unix" && !r.url.contains("://") {
        let auth = if r.auth.is_empty() {
            String::new()
        } else {
            format!("?pass={}", encode(split_auth(&r.auth).1))
        };
        return Ok(format!("redis+unix://{}{auth}", r.url));
    }
    tcp(&r.url, r, &r.auth)
}

/// The nodes of `REDIS_TYPE=CLUSTER`.
pub(super) fn nodes(r: &RedisSettings) -> Result<Vec<String>, BackendError> {
    r.url.split(',').map(|n| tcp(n, r, &r.auth)).collect()
}

/// `master_name,sentinel1:port,...` of `REDIS_TYPE=SENTINEL`.
pub(super) fn sentinels(r: &RedisSettings) -> Result<(String, Vec<String>), BackendError> {
    let mut parts = r.url.split(',');
    let master = parts.next().unwrap_or("").trim().to_owned();
    let sentinels = parts
        .map(|s| tcp(s, r, &r.sentinel_auth))
        .collect::<Result<Vec<_>, _>>()?;
    if master.is_empty() || sentinels.is_empty() {
        return Err(BackendError(
            "REDIS_URL: expected master_name,sentinel_host:port,... with REDIS_TYPE=SENTINEL"
                .into(),
        ));
    }
    Ok((master, sentinels))
}
