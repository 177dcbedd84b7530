//! Upstream variables that are accepted but change nothing here: each one
//! set is named in a warning at start (never dropped silently), with why.
//! Those whose feature is refused are in `upstream::refuse_unsupported`.

use super::{Env, SettingsError};

/// What the other settings decided, for the notices that depend on it.
pub(super) struct Decided {
    pub xds: bool,
    pub grpc_tls: bool,
    pub statsd: bool,
    pub prometheus: bool,
    pub redis_tls: bool,
    pub redis: bool,
    pub response_headers: bool,
}

const NO_POOL: &str = "no effect: the Redis stores multiplex one connection per server, \
                       with no pool or pipeline window to tune";

/// `(variables, why)`: a warning for those of `variables` that are set.
fn fixed() -> Vec<(&'static [&'static str], &'static str)> {
    vec![
        (
            &[
                "REDIS_POOL_SIZE",
                "REDIS_PIPELINE_WINDOW",
                "REDIS_PIPELINE_LIMIT",
                "REDIS_CLUSTER_PIPELINE_PARALLELISM",
                "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            ],
            NO_POOL,
        ),
        (
            &["REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"],
            "no effect: health follows a probe of the store every second",
        ),
        (
            &[
                "REDIS_STARTUP_INITIAL_INTERVAL",
                "REDIS_STARTUP_MAX_INTERVAL",
                "REDIS_STARTUP_MAX_ELAPSED_TIME",
            ],
            "no effect: there is no start-up retry schedule here",
        ),
        (
            &["LOCAL_CACHE_SIZE_IN_BYTES"],
            "no effect: there is no local cache of over-limit keys; every hit reaches the store",
        ),
        (
            &["PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS"],
            "no effect: there is no response-time metric here",
        ),
        (
            &[
                "REDIS_PERSECOND_SOCKET_TYPE",
                "REDIS_PERSECOND_TYPE",
                "REDIS_PERSECOND_URL",
                "REDIS_PERSECOND_POOL_SIZE",
                "REDIS_PERSECOND_AUTH",
                "REDIS_PERSECOND_TLS",
                "REDIS_PERSECOND_SENTINEL_AUTH",
                "REDIS_PERSECOND_PIPELINE_WINDOW",
                "REDIS_PERSECOND_PIPELINE_LIMIT",
                "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
                "REDIS_PERSECOND_TIMEOUT",
                "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
            ],
            "only read with REDIS_PERSECOND=true, which is not supported",
        ),
        (
            &[
                "MEMCACHE_HOST_PORT",
                "MEMCACHE_MAX_IDLE_CONNS",
                "MEMCACHE_SRV",
                "MEMCACHE_SRV_REFRESH",
                "MEMCACHE_TLS",
                "MEMCACHE_TLS_CLIENT_CERT",
                "MEMCACHE_TLS_CLIENT_KEY",
                "MEMCACHE_TLS_CACERT",
                "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
            ],
            "only read with BACKEND_TYPE=memcache, which is not supported",
        ),
        (
            &["USE_DOG_STATSD_MOGRIFIERS"],
            "only read with USE_DOG_STATSD=true, which is not supported",
        ),
        (
            &["GRPC_SERVER_TLS_CA_CERT"],
            "not read, as upstream does not read it (Envoy Gateway sets it): clients are \
             asked for a certificate only with GRPC_CLIENT_TLS_CACERT",
        ),
    ]
}

const TRACING: &[&str] = &[
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_INSECURE",
];

/// The warnings, one per reason: `NAME[, NAME...]: why`.
pub(super) fn notices(env: &Env<'_>, d: &Decided) -> Result<Vec<String>, SettingsError> {
    let set = |name: &str| (env.0)(name).is_some_and(|v| !v.trim().is_empty());
    let mut out = Vec::new();
    let mut note = |names: &[&str], why: &str| {
        let present: Vec<&str> = names.iter().copied().filter(|n| set(n)).collect();
        if !present.is_empty() {
            out.push(format!("{}: {why}", present.join(", ")));
        }
    };
    for (names, why) in fixed() {
        note(names, why);
    }
    if d.xds {
        note(
            &[
                "RUNTIME_ROOT",
                "RUNTIME_SUBDIRECTORY",
                "RUNTIME_APPDIRECTORY",
                "RUNTIME_WATCH_ROOT",
                "RUNTIME_IGNOREDOTFILES",
            ],
            "only read with CONFIG_TYPE=FILE, as upstream: the configuration comes from \
             the xDS server",
        );
    } else {
        note(
            super::xds::VARIABLES,
            "only read with CONFIG_TYPE=GRPC_XDS_SOTW, as upstream: the configuration \
             comes from files",
        );
    }
    if !d.grpc_tls {
        note(
            &[
                "GRPC_SERVER_TLS_CERT",
                "GRPC_SERVER_TLS_KEY",
                "GRPC_CLIENT_TLS_CACERT",
                "GRPC_CLIENT_TLS_SAN",
            ],
            "only read with GRPC_SERVER_USE_TLS=true, as upstream: gRPC is plain text",
        );
    }
    if !d.statsd {
        note(
            &[
                "STATSD_HOST",
                "STATSD_PORT",
                "STATSD_PROTOCOL",
                "STATS_FLUSH_INTERVAL",
            ],
            "only read when statsd is on (USE_STATSD)",
        );
    }
    if !d.prometheus {
        note(
            &[
                "PROMETHEUS_ADDR",
                "PROMETHEUS_PATH",
                "PROMETHEUS_MAPPER_YAML",
            ],
            "only read with USE_PROMETHEUS=true (and DISABLE_STATS not true)",
        );
    }
    if !d.redis {
        note(
            &[
                "REDIS_URL",
                "REDIS_TYPE",
                "REDIS_SOCKET_TYPE",
                "REDIS_TIMEOUT",
                "REDIS_AUTH",
                "REDIS_SENTINEL_AUTH",
                "REDIS_TLS",
                "REDIS_TLS_CACERT",
                "REDIS_TLS_CLIENT_CERT",
                "REDIS_TLS_CLIENT_KEY",
                "RLS_REDIS_FALLBACK",
            ],
            "only read with BACKEND_TYPE=redis: the counters are in memory",
        );
    }
    if !d.response_headers {
        note(
            &[
                "LIMIT_LIMIT_HEADER",
                "LIMIT_REMAINING_HEADER",
                "LIMIT_RESET_HEADER",
            ],
            "only read with LIMIT_RESPONSE_HEADERS_ENABLED=true, as upstream",
        );
    }
    if d.redis && !d.redis_tls {
        note(
            &[
                "REDIS_TLS_CACERT",
                "REDIS_TLS_CLIENT_CERT",
                "REDIS_TLS_CLIENT_KEY",
            ],
            "only used with REDIS_TLS=true or a rediss:// REDIS_URL",
        );
    }
    if env.flag("TRACING_ENABLED", false)? {
        let protocol = env.string("TRACING_EXPORTER_PROTOCOL", "http");
        if !matches!(protocol.as_str(), "http" | "grpc" | "") {
            return Err(SettingsError::invalid(
                "TRACING_EXPORTER_PROTOCOL",
                &protocol,
                "expected http or grpc",
            ));
        }
        let mut names = vec!["TRACING_ENABLED"];
        names.extend(TRACING);
        note(
            &names,
            "accepted, but throttle-rls exports no spans (no OTLP exporter)",
        );
    } else {
        note(TRACING, "only read with TRACING_ENABLED=true, as upstream");
    }
    Ok(out)
}
