//! Settings from the environment: upstream's names and defaults
//! (envoyproxy/ratelimit `src/settings/settings.go`), plus a few `RLS_*`
//! extensions. A bad value is a [`SettingsError`] at start-up, never a panic
//! and never an error per request.

mod grpc_tls;
mod leases;
mod logs;
mod notices;
mod parse;
mod redis_keys;
mod stats;
mod upstream;
mod xds;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use parse::{bool_value, duration_value, ratio_value, u16_value, u64_value};
pub use redis_keys::RedisKeys;
use upstream::{backend, refuse_unsupported};

pub use grpc_tls::GrpcTls;
pub use leases::Leases;
pub use stats::Statsd;
pub use xds::{XdsBackoff, XdsSettings, XdsTls};

/// Where counters live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// In process (`BACKEND_TYPE=memory`, or `REDIS_URL` unset).
    Memory,
    /// Redis, through the crate's Redis stores.
    Redis(RedisSettings),
}

/// Upstream's `REDIS_TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisType {
    /// One server (`SINGLE`).
    Single,
    /// Sentinel: `REDIS_URL` is `master_name,sentinel1:port,...`.
    Sentinel,
    /// Redis Cluster: `REDIS_URL` is `node1:port,node2:port,...`.
    Cluster,
}

/// The `REDIS_*` settings.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `REDIS_SOCKET_TYPE`: `tcp` or `unix`.
    pub socket_type: String,
    /// `REDIS_TYPE`.
    pub redis_type: RedisType,
    /// `REDIS_URL`.
    pub url: String,
    /// `REDIS_AUTH` (`password` or `user:password`); never printed.
    pub auth: String,
    /// `REDIS_SENTINEL_AUTH`: the sentinels' own password; never printed.
    pub sentinel_auth: String,
    /// `REDIS_TLS`.
    pub tls: bool,
    /// `REDIS_TLS_CACERT`: a PEM file of roots (default: the system's).
    pub tls_ca_cert: Option<PathBuf>,
    /// `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// `REDIS_TIMEOUT` (default 10s).
    pub timeout: Duration,
    /// `RLS_REDIS_FALLBACK=memory`: decide in process while Redis is down.
    pub fallback_to_memory: bool,
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("socket_type", &self.socket_type)
            .field("redis_type", &self.redis_type)
            .field("url", &"<redacted>")
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("fallback_to_memory", &self.fallback_to_memory)
            .finish_non_exhaustive()
    }
}

/// Every setting the service reads.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `GRPC_HOST`:`GRPC_PORT` (default `0.0.0.0:8081`).
    pub grpc_addr: String,
    /// `GRPC_UDS`: when set, gRPC listens on this unix socket instead.
    pub grpc_uds: Option<PathBuf>,
    /// `HOST`:`PORT` (default `0.0.0.0:8080`): `/json`, `/healthcheck`.
    pub http_addr: String,
    /// `DEBUG_HOST`:`DEBUG_PORT` (default `0.0.0.0:6070`): `/rlconfig`.
    pub debug_addr: String,
    /// `RUNTIME_ROOT` (default `/srv/runtime_data/current`).
    pub runtime_root: PathBuf,
    /// `RUNTIME_SUBDIRECTORY` (default empty).
    pub runtime_subdirectory: String,
    /// `RUNTIME_APPDIRECTORY` (default `config`).
    pub runtime_appdirectory: String,
    /// `RUNTIME_WATCH_ROOT` (default true). Either way the config directory
    /// is polled; see [`crate::reload`].
    pub runtime_watch_root: bool,
    /// `RUNTIME_IGNOREDOTFILES` (default false).
    pub runtime_ignore_dotfiles: bool,
    /// `RLS_RELOAD_INTERVAL` (default 1s): how often the directory is polled.
    pub reload_interval: Duration,
    /// `MERGE_DOMAIN_CONFIG` (default false).
    pub merge_domain_config: bool,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG` (default false).
    pub force_start_without_initial_config: bool,
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration comes from this xDS
    /// server; `None` with `CONFIG_TYPE=FILE` (the default).
    pub xds: Option<XdsSettings>,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` (default false).
    pub healthy_with_at_least_one_config_loaded: bool,
    /// `BACKEND_TYPE` and `REDIS_*`.
    pub backend: Backend,
    /// `CACHE_KEY_PREFIX` (default empty).
    pub cache_key_prefix: String,
    /// `RLS_REDIS_KEYS` (default `upstream`): see [`RedisKeys`].
    pub redis_keys: RedisKeys,
    /// `RLS_LEASES` (default `on` with Redis): see [`Leases`].
    pub leases: Leases,
    /// `EXPIRATION_JITTER_MAX_SECONDS` (default 300): upstream-format
    /// counter keys live their unit plus a random 0 to this − 1 seconds.
    pub expiration_jitter_max_seconds: u64,
    /// `SHADOW_MODE` (default false).
    pub shadow_mode: bool,
    /// `QUOTA_MODE` (default false).
    pub quota_mode: bool,
    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` or `RLS_ALL_OR_NOTHING`
    /// (default false): a refused request charges no descriptor.
    pub all_or_nothing: bool,
    /// `RLS_STRICT_UPSTREAM_KEYS` (default false): reject the extension keys.
    pub strict_upstream_keys: bool,
    /// `NEAR_LIMIT_RATIO` (default 0.8), for the `near_limit` metric.
    pub near_limit_ratio: f32,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED` (default false) and the three names.
    pub response_headers: Option<[String; 3]>,
    /// `USE_PROMETHEUS` (default false): serve metrics on `PROMETHEUS_ADDR`.
    pub prometheus: Option<(String, String)>,
    /// `PROMETHEUS_MAPPER_YAML`: a statsd_exporter mapping file.
    pub prometheus_mapper: Option<PathBuf>,
    /// `USE_STATSD` (default true, as upstream) and `STATSD_*`.
    pub statsd: Option<Statsd>,
    /// `GRPC_SERVER_USE_TLS` (default false) and its files.
    pub grpc_tls: Option<GrpcTls>,
    /// Upstream variables set here that change nothing, each with why:
    /// logged as warnings at start.
    pub notices: Vec<String>,
    /// `LOG_LEVEL` (default `WARN`).
    pub log_level: String,
    /// `LOG_FORMAT` is `json` (default `text`).
    pub log_json: bool,
    /// `RLS_MEMORY_MAX_KEYS` (default 1,000,000): the memory store's cap.
    pub memory_max_keys: usize,
    /// `RLS_MAX_DESCRIPTORS` (default 64): descriptors per request.
    pub max_descriptors: usize,
    /// `RLS_MAX_ENTRIES` (default 32): entries per descriptor.
    pub max_entries: usize,
    /// `RLS_MAX_VALUE_BYTES` (default 4096): bytes of one entry key or value.
    pub max_value_bytes: usize,
    /// `RLS_SHUTDOWN_GRACE` (default 10s): how long in-flight calls may take
    /// after SIGTERM.
    pub shutdown_grace: Duration,
    /// `GRPC_MAX_CONNECTION_AGE` (default 24h) and `GRPC_MAX_CONNECTION_AGE_GRACE`
    /// (default 1h): a gRPC connection gets a GOAWAY at this age, so clients
    /// rebalance, and is closed under any call still open at age + grace.
    /// Zero is never, as in grpc-go.
    pub grpc_max_connection_age: (Duration, Duration),
    /// `RLS_TEST_CLOCK` (default false): time stands still and moves only by
    /// `POST /test/clock?now_unix=N` on the debug listener. For conformance
    /// tests, never in production.
    pub test_clock: bool,
}

/// A setting that cannot be used: the variable, its value, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError {
    /// The environment variable.
    pub name: &'static str,
    /// Why (the value is quoted here unless secret).
    pub message: String,
}

impl SettingsError {
    fn invalid(name: &'static str, raw: &str, expected: &str) -> Self {
        SettingsError {
            name,
            message: format!("invalid value {raw:?}: {expected}"),
        }
    }

    fn unsupported(name: &'static str, what: &str) -> Self {
        SettingsError {
            name,
            message: format!("{what} is not supported by throttle-rls"),
        }
    }
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.message)
    }
}

impl std::error::Error for SettingsError {}

/// Reads variables through a lookup (the process environment in `main`, a
/// map in tests).
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn string(&self, name: &str, default: &str) -> String {
        (self.0)(name).unwrap_or_else(|| default.to_owned())
    }

    fn flag(&self, name: &'static str, default: bool) -> Result<bool, SettingsError> {
        (self.0)(name).map_or(Ok(default), |raw| bool_value(name, &raw))
    }

    fn port(&self, name: &'static str, default: u16) -> Result<u16, SettingsError> {
        (self.0)(name).map_or(Ok(default), |raw| u16_value(name, &raw))
    }

    fn count(&self, name: &'static str, default: u64) -> Result<u64, SettingsError> {
        (self.0)(name).map_or(Ok(default), |raw| u64_value(name, &raw))
    }

    fn duration(&self, name: &'static str, default: Duration) -> Result<Duration, SettingsError> {
        (self.0)(name).map_or(Ok(default), |raw| duration_value(name, &raw))
    }
}

/// A header name the service sends Envoy: checked at start, not by Envoy
/// on every response.
fn header_name(env: &Env<'_>, name: &'static str, default: &str) -> Result<String, SettingsError> {
    let value = env.string(name, default);
    match tonic::codegen::http::HeaderName::from_bytes(value.as_bytes()) {
        Ok(_) => Ok(value),
        Err(_) => Err(SettingsError::invalid(
            name,
            &value,
            "expected an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
        )),
    }
}

/// `host:port`, bracketing an IPv6 host.
fn join(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Settings {
    /// From the process environment. A variable the service reads whose
    /// value is not UTF-8 is refused by name, never taken for unset.
    pub fn from_env() -> Result<Settings, SettingsError> {
        let not_unicode = std::cell::RefCell::new(None);
        let settings = Self::from_lookup(&|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                not_unicode
                    .borrow_mut()
                    .get_or_insert_with(|| name.to_owned());
                None
            }
        });
        match not_unicode.into_inner() {
            // Leaked once: the process stops with this error.
            Some(name) => Err(SettingsError {
                name: Box::leak(name.into_boxed_str()),
                message: "its value is not valid UTF-8".to_owned(),
            }),
            None => settings,
        }
    }

    /// From any lookup of variable names (unset = `None`).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let env = Env(lookup);
        refuse_unsupported(&env)?;
        let addr = |host: &'static str, port: &'static str, h: &str, p: u16| {
            Ok::<_, SettingsError>(join(&env.string(host, h), env.port(port, p)?))
        };
        let disable_stats = env.flag("DISABLE_STATS", false)?;
        let prometheus = stats::prometheus(&env, disable_stats)?;
        let response_headers = match env.flag("LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            true => Some([
                header_name(&env, "LIMIT_LIMIT_HEADER", "RateLimit-Limit")?,
                header_name(&env, "LIMIT_REMAINING_HEADER", "RateLimit-Remaining")?,
                header_name(&env, "LIMIT_RESET_HEADER", "RateLimit-Reset")?,
            ]),
            false => None,
        };
        let (log_level, log_json) = logs::logs(&env)?;
        let statsd = stats::statsd(&env, prometheus.is_some(), disable_stats)?;
        stats::refuse_extra_tags(&env)?;
        let grpc_tls = grpc_tls::grpc_tls(&env)?;
        let backend = backend(&env)?;
        let leases = leases::leases(&env, &backend)?;
        let xds = xds::xds(&env)?;
        let decided = notices::Decided {
            xds: xds.is_some(),
            grpc_tls: grpc_tls.is_some(),
            statsd: statsd.is_some(),
            prometheus: prometheus.is_some(),
            redis_tls: matches!(&backend, Backend::Redis(r) if r.tls || r.url.contains("rediss://")),
            redis: matches!(&backend, Backend::Redis(_)),
            response_headers: response_headers.is_some(),
        };
        let notices = notices::notices(&env, &decided)?;
        let prometheus_mapper = prometheus
            .as_ref()
            .and(lookup("PROMETHEUS_MAPPER_YAML"))
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let limit = |name: &'static str, default: u64| -> Result<usize, SettingsError> {
            match env.count(name, default)? {
                0 => Err(SettingsError::invalid(name, "0", "expected at least 1")),
                n => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            }
        };
        Ok(Settings {
            grpc_addr: addr("GRPC_HOST", "GRPC_PORT", "0.0.0.0", 8081)?,
            grpc_uds: Some(env.string("GRPC_UDS", ""))
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            http_addr: addr("HOST", "PORT", "0.0.0.0", 8080)?,
            debug_addr: addr("DEBUG_HOST", "DEBUG_PORT", "0.0.0.0", 6070)?,
            runtime_root: env
                .string("RUNTIME_ROOT", "/srv/runtime_data/current")
                .into(),
            runtime_subdirectory: env.string("RUNTIME_SUBDIRECTORY", ""),
            runtime_appdirectory: env.string("RUNTIME_APPDIRECTORY", "config"),
            runtime_watch_root: env.flag("RUNTIME_WATCH_ROOT", true)?,
            runtime_ignore_dotfiles: env.flag("RUNTIME_IGNOREDOTFILES", false)?,
            reload_interval: reload_interval(&env)?,
            merge_domain_config: env.flag("MERGE_DOMAIN_CONFIG", false)?,
            force_start_without_initial_config: env
                .flag("FORCE_START_WITHOUT_INITIAL_CONFIG", false)?,
            xds,
            healthy_with_at_least_one_config_loaded: env
                .flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)?,
            backend,
            cache_key_prefix: env.string("CACHE_KEY_PREFIX", ""),
            redis_keys: redis_keys::redis_keys(&env)?,
            leases,
            expiration_jitter_max_seconds: redis_keys::jitter(&env)?,
            shadow_mode: env.flag("SHADOW_MODE", false)?,
            quota_mode: env.flag("QUOTA_MODE", false)?,
            all_or_nothing: env.flag("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)?
                | env.flag("RLS_ALL_OR_NOTHING", false)?,
            strict_upstream_keys: env.flag("RLS_STRICT_UPSTREAM_KEYS", false)?,
            near_limit_ratio: (lookup)("NEAR_LIMIT_RATIO")
                .map_or(Ok(0.8), |raw| ratio_value("NEAR_LIMIT_RATIO", &raw))?,
            response_headers,
            prometheus,
            prometheus_mapper,
            statsd,
            grpc_tls,
            notices,
            log_level,
            log_json,
            memory_max_keys: limit("RLS_MEMORY_MAX_KEYS", 1_000_000)?,
            max_descriptors: limit("RLS_MAX_DESCRIPTORS", 64)?,
            max_entries: limit("RLS_MAX_ENTRIES", 32)?,
            max_value_bytes: limit("RLS_MAX_VALUE_BYTES", 4096)?,
            shutdown_grace: env.duration("RLS_SHUTDOWN_GRACE", Duration::from_secs(10))?,
            test_clock: env.flag("RLS_TEST_CLOCK", false)?,
            grpc_max_connection_age: (
                env.duration("GRPC_MAX_CONNECTION_AGE", Duration::from_secs(86_400))?,
                env.duration("GRPC_MAX_CONNECTION_AGE_GRACE", Duration::from_secs(3_600))?,
            ),
        })
    }

    /// `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`: the directory
    /// whose `*.yaml` files are the configuration.
    pub fn config_dir(&self) -> PathBuf {
        self.runtime_root
            .join(&self.runtime_subdirectory)
            .join(&self.runtime_appdirectory)
    }
}

/// `RLS_RELOAD_INTERVAL`: how often the configuration is looked at (above
/// zero).
fn reload_interval(env: &Env<'_>) -> Result<Duration, SettingsError> {
    match env.duration("RLS_RELOAD_INTERVAL", Duration::from_secs(1))? {
        d if d.is_zero() => Err(SettingsError::invalid(
            "RLS_RELOAD_INTERVAL",
            "0",
            "expected a duration above zero",
        )),
        d => Ok(d),
    }
}

#[cfg(test)]
mod tests;
