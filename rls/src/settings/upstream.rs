//! The backend settings (`BACKEND_TYPE`, `REDIS_*`) and the upstream
//! settings this server refuses rather than ignores.

use std::path::PathBuf;
use std::time::Duration;

use super::{Backend, Env, RedisSettings, RedisType, SettingsError};

/// Settings of upstream this server does not implement: refused rather
/// than silently ignored, since a deployment relies on them.
pub(super) fn refuse_unsupported(env: &Env<'_>) -> Result<(), SettingsError> {
    // CONFIG_TYPE: FILE or GRPC_XDS_SOTW, anything else refused by `xds::xds`.
    let switches: [(&'static str, &str); 4] = [
        ("REDIS_PERSECOND", "a second Redis for per-second limits"),
        ("RESPONSE_DYNAMIC_METADATA", "dynamic metadata in responses"),
        ("USE_DOG_STATSD", "dogstatsd"),
        (
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "skipping Redis TLS hostname verification",
        ),
    ];
    for (name, what) in switches {
        if env.flag(name, false)? {
            return Err(SettingsError::unsupported(name, what));
        }
    }
    Ok(())
}

pub(super) fn backend(env: &Env<'_>) -> Result<Backend, SettingsError> {
    let url = (env.0)("REDIS_URL");
    let kind = env.string(
        "BACKEND_TYPE",
        if url.is_some() { "redis" } else { "memory" },
    );
    match kind.as_str() {
        "memory" => return Ok(Backend::Memory),
        "redis" => {}
        "memcache" => return Err(SettingsError::unsupported("BACKEND_TYPE", "memcache")),
        other => {
            return Err(SettingsError::invalid(
                "BACKEND_TYPE",
                other,
                "expected redis or memory",
            ))
        }
    }
    let socket_type = env.string("REDIS_SOCKET_TYPE", "unix");
    if !matches!(socket_type.as_str(), "tcp" | "unix") {
        return Err(SettingsError::invalid(
            "REDIS_SOCKET_TYPE",
            &socket_type,
            "expected tcp or unix",
        ));
    }
    let redis_type = match env
        .string("REDIS_TYPE", "SINGLE")
        .to_ascii_uppercase()
        .as_str()
    {
        "SINGLE" => RedisType::Single,
        "SENTINEL" => RedisType::Sentinel,
        "CLUSTER" => RedisType::Cluster,
        other => {
            return Err(SettingsError::invalid(
                "REDIS_TYPE",
                other,
                "expected SINGLE, SENTINEL or CLUSTER",
            ))
        }
    };
    let path = |name: &str| (env.0)(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    let tls_client = match (path("REDIS_TLS_CLIENT_CERT"), path("REDIS_TLS_CLIENT_KEY")) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(SettingsError {
                name: "REDIS_TLS_CLIENT_CERT",
                message: "REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into(),
            })
        }
    };
    let fallback = env.string("RLS_REDIS_FALLBACK", "none");
    let fallback_to_memory = match fallback.as_str() {
        "none" => false,
        "memory" => true,
        other => {
            return Err(SettingsError::invalid(
                "RLS_REDIS_FALLBACK",
                other,
                "expected none or memory",
            ))
        }
    };
    Ok(Backend::Redis(RedisSettings {
        socket_type,
        redis_type,
        url: url.unwrap_or_else(|| "/var/run/nutcracker/ratelimit.sock".to_owned()),
        auth: env.string("REDIS_AUTH", ""),
        sentinel_auth: env.string("REDIS_SENTINEL_AUTH", ""),
        tls: env.flag("REDIS_TLS", false)?,
        tls_ca_cert: path("REDIS_TLS_CACERT"),
        tls_client,
        timeout: redis_timeout(env)?,
        fallback_to_memory,
    }))
}

/// `REDIS_TIMEOUT` (default 10s), above zero: upstream's 0 means no timeout
/// at all, which a stalled Redis would turn into every request waiting.
fn redis_timeout(env: &Env<'_>) -> Result<Duration, SettingsError> {
    const NAME: &str = "REDIS_TIMEOUT";
    match env.duration(NAME, Duration::from_secs(10))? {
        Duration::ZERO => Err(SettingsError {
            name: NAME,
            message:
                "0 (no timeout) is not supported: give the longest wait for Redis, such as 10s"
                    .to_owned(),
        }),
        timeout => Ok(timeout),
    }
}
