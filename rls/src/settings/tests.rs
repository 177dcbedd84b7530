use std::collections::HashMap;

use super::*;

fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Settings::from_lookup(&move |name| map.get(name).cloned())
}

#[test]
fn upstream_defaults_with_memory_when_redis_url_is_unset() {
    let s = settings(&[]).unwrap();
    assert_eq!(s.grpc_addr, "0.0.0.0:8081");
    assert_eq!(s.http_addr, "0.0.0.0:8080");
    assert_eq!(s.debug_addr, "0.0.0.0:6070");
    assert_eq!(
        s.config_dir(),
        PathBuf::from("/srv/runtime_data/current/config")
    );
    assert_eq!(s.backend, Backend::Memory);
    assert!(s.runtime_watch_root && !s.shadow_mode && !s.all_or_nothing);
    assert_eq!(s.near_limit_ratio, 0.8);
    assert!(s.prometheus.is_none());
}

#[test]
fn redis_when_its_url_is_set() {
    let s = settings(&[
        ("REDIS_URL", "127.0.0.1:6379"),
        ("REDIS_SOCKET_TYPE", "tcp"),
    ])
    .unwrap();
    let Backend::Redis(r) = s.backend else {
        panic!("memory")
    };
    assert_eq!(
        (r.url.as_str(), r.redis_type),
        ("127.0.0.1:6379", RedisType::Single)
    );
    assert!(
        !format!("{r:?}").contains("6379"),
        "the URL may hold a password"
    );
    let s = settings(&[("BACKEND_TYPE", "memory"), ("REDIS_URL", "x:1")]).unwrap();
    assert_eq!(s.backend, Backend::Memory);
}

#[test]
fn stop_increment_and_all_or_nothing_are_one_mode() {
    assert!(
        settings(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")])
            .unwrap()
            .all_or_nothing
    );
    assert!(
        settings(&[("RLS_ALL_OR_NOTHING", "1")])
            .unwrap()
            .all_or_nothing
    );
}

#[test]
fn prometheus_addr_like_go() {
    let s = settings(&[("USE_PROMETHEUS", "true")]).unwrap();
    assert_eq!(
        s.prometheus,
        Some(("0.0.0.0:9090".into(), "/metrics".into()))
    );
}

#[test]
fn bad_values_name_the_variable() {
    for (name, value) in [
        ("GRPC_PORT", "http"),
        ("SHADOW_MODE", "maybe"),
        ("NEAR_LIMIT_RATIO", "2"),
        ("REDIS_TYPE", "RING"),
        ("BACKEND_TYPE", "etcd"),
        ("REDIS_TIMEOUT", "10"),
        // Upstream's "no timeout": every request would wait on a stall.
        ("REDIS_TIMEOUT", "0"),
        ("REDIS_TIMEOUT", "0s"),
        // Beyond Go's longest duration (an interval or a retry would
        // overflow the clock).
        ("STATS_FLUSH_INTERVAL", "2562048h"),
        ("RLS_SHUTDOWN_GRACE", "99999999999999999999h"),
        ("LOG_LEVEL", "loud"),
        ("RLS_MAX_DESCRIPTORS", "0"),
        ("RLS_RELOAD_INTERVAL", "0"),
        // Header names Envoy would refuse on every response.
        ("LIMIT_LIMIT_HEADER", "Rate Limit"),
        ("LIMIT_REMAINING_HEADER", ""),
        ("LIMIT_RESET_HEADER", "reset\u{e9}"),
        // A destination has no port 0.
        ("STATSD_PORT", "0"),
    ] {
        let mut vars = vec![(name, value)];
        if name.starts_with("REDIS") {
            vars.push(("REDIS_URL", "127.0.0.1:1"));
        }
        if name.starts_with("LIMIT_") {
            vars.push(("LIMIT_RESPONSE_HEADERS_ENABLED", "true"));
        }
        if name.starts_with("STATSD") {
            vars.push(("USE_STATSD", "true"));
        }
        let err = settings(&vars).unwrap_err();
        assert_eq!(err.name, name, "{err}");
    }
}

#[test]
fn unsupported_upstream_features_are_refused_at_start() {
    for (name, value) in [
        ("BACKEND_TYPE", "memcache"),
        ("REDIS_PERSECOND", "true"),
        ("EXTRA_TAGS", "a:b"),
    ] {
        let err = settings(&[(name, value)]).unwrap_err();
        assert_eq!(err.name, name);
        assert!(err.to_string().contains("not supported"), "{err}");
    }
}

#[test]
fn grpc_connection_age_and_uds() {
    let s = settings(&[
        ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
        ("GRPC_UDS", "/run/rls.sock"),
    ])
    .unwrap();
    assert_eq!(
        s.grpc_max_connection_age,
        (Duration::from_secs(5_400), Duration::from_secs(3_600))
    );
    assert_eq!(s.grpc_uds, Some(PathBuf::from("/run/rls.sock")));
    // Zero is grpc-go's "never", for either.
    let s = settings(&[
        ("GRPC_MAX_CONNECTION_AGE", "0"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "0s"),
    ])
    .unwrap();
    assert_eq!(s.grpc_max_connection_age, (Duration::ZERO, Duration::ZERO));
}

#[test]
fn grpc_tls_as_upstream_reads_it() {
    let tls = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ];
    let t = settings(&tls).unwrap().grpc_tls.unwrap();
    assert_eq!(t.cert, PathBuf::from("/certs/tls.crt"));
    assert!(t.client_ca.is_none() && t.client_san.is_none());
    let err = settings(&tls[..2]).unwrap_err();
    assert_eq!(err.name, "GRPC_SERVER_TLS_KEY", "{err}");
    let mut v = tls.to_vec();
    v.push(("GRPC_CLIENT_TLS_SAN", "envoy"));
    assert_eq!(settings(&v).unwrap_err().name, "GRPC_CLIENT_TLS_SAN");
    v.push(("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"));
    assert_eq!(
        settings(&v)
            .unwrap()
            .grpc_tls
            .unwrap()
            .client_san
            .as_deref(),
        Some("envoy")
    );
    v.push(("GRPC_CLIENT_TLS_SAN", "spiffe://x/y"));
    let err = settings(&v).unwrap_err();
    assert_eq!(err.name, "GRPC_CLIENT_TLS_SAN", "{err}");
    // Files without the switch are named at start, not used.
    let s = settings(&tls[1..]).unwrap();
    assert!(s.grpc_tls.is_none());
    assert!(
        s.notices[0].starts_with("GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY: only read with"),
        "{:?}",
        s.notices
    );
}

#[test]
fn statsd_on_by_default_as_upstream() {
    let s = settings(&[]).unwrap().statsd.unwrap();
    assert_eq!((s.host.as_str(), s.port, s.tcp), ("localhost", 8125, true));
    assert_eq!(s.flush_interval, Duration::from_secs(10));
    let s = settings(&[("STATSD_PROTOCOL", "udp"), ("STATS_FLUSH_INTERVAL", "1s")]).unwrap();
    assert!(!s.statsd.unwrap().tcp);
    assert!(settings(&[("USE_STATSD", "false")])
        .unwrap()
        .statsd
        .is_none());
    // Prometheus alone turns statsd off; both asked for is upstream's refusal.
    let s = settings(&[("USE_PROMETHEUS", "true")]).unwrap();
    assert!(s.statsd.is_none() && s.prometheus.is_some());
    let both = [("USE_PROMETHEUS", "true"), ("USE_STATSD", "true")];
    assert_eq!(settings(&both).unwrap_err().name, "USE_STATSD");
    let s = settings(&[("USE_PROMETHEUS", "true"), ("DISABLE_STATS", "true")]).unwrap();
    assert!(s.statsd.is_none() && s.prometheus.is_none());
    assert_eq!(
        settings(&[("STATSD_PROTOCOL", "quic")]).unwrap_err().name,
        "STATSD_PROTOCOL"
    );
}

#[test]
fn envoy_gateways_environment_is_accepted_and_its_dead_variables_named() {
    let s = settings(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.redis.svc:6379"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", ":19001"),
        ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
    ])
    .unwrap();
    assert!(s.grpc_tls.is_some() && s.statsd.is_none());
    assert_eq!(
        s.prometheus_mapper,
        Some(PathBuf::from("/etc/statsd-exporter/conf.yaml"))
    );
    let notices = s.notices.join("\n");
    for said in [
        "CONFIG_GRPC_XDS_NODE_ID, CONFIG_GRPC_XDS_SERVER_URL: only read with CONFIG_TYPE=GRPC_XDS_SOTW",
        "GRPC_SERVER_TLS_CA_CERT: not read, as upstream does not read it",
        "TRACING_ENABLED, OTEL_EXPORTER_OTLP_ENDPOINT: accepted, but throttle-rls exports no spans",
    ] {
        assert!(notices.contains(said), "{notices}");
    }
    assert_eq!(s.notices.len(), 3, "{notices}");
}

#[test]
fn config_type_is_file_or_xds_and_nothing_else() {
    assert!(settings(&[]).unwrap().xds.is_none());
    assert!(settings(&[("CONFIG_TYPE", "FILE")]).unwrap().xds.is_none());
    for other in ["GRPC_XDS_DELTA", "file", "xds"] {
        let err = settings(&[("CONFIG_TYPE", other)]).unwrap_err();
        assert_eq!(err.name, "CONFIG_TYPE", "{err}");
    }
}

#[test]
fn xds_settings_have_upstreams_defaults() {
    let s = settings(&[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap();
    let x = s.xds.unwrap();
    assert_eq!((x.host.as_str(), x.port), ("localhost", 18000));
    assert_eq!(x.server_url, "localhost:18000");
    assert_eq!(x.node_id, "default");
    assert!(x.node_metadata.is_empty() && x.additional_headers.is_empty());
    assert_eq!(x.connect_retry_interval, Duration::from_secs(3));
    assert_eq!(x.tls, None);
    assert_eq!(
        x.backoff,
        crate::settings::XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    );
    assert_eq!(x.max_msg_size, None);
    assert!(s.notices.is_empty(), "{:?}", s.notices);
}

#[test]
fn xds_settings_are_read_as_upstream_reads_them() {
    let s = settings(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "[::1]:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        // Upstream's comment says `k1:v1`, its code splits on `=` only.
        ("CONFIG_GRPC_XDS_NODE_METADATA", "a=1,b:2,c=x=y"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:t1,auth:k",
        ),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "250ms"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "2m"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
        ("XDS_CLIENT_BACKOFF_JITTER", "false"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1048576"),
        ("RUNTIME_ROOT", "/data"),
    ])
    .unwrap();
    let x = s.xds.unwrap();
    assert_eq!((x.host.as_str(), x.port), ("::1", 18001));
    assert_eq!(x.node_id, "envoy-ratelimit");
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(x.node_metadata, pairs(&[("a", "1"), ("c", "x=y")]));
    assert_eq!(
        x.additional_headers,
        pairs(&[("x-tenant", "t1"), ("auth", "k")])
    );
    assert_eq!(x.connect_retry_interval, Duration::from_millis(250));
    assert_eq!(x.backoff.initial, Duration::from_secs(1));
    assert_eq!(x.backoff.max, Duration::from_secs(120));
    assert_eq!((x.backoff.factor, x.backoff.jitter), (2.0, false));
    assert_eq!(x.max_msg_size, Some(1_048_576));
    // The config directory is not read with xDS: RUNTIME_* is named.
    let notices = s.notices.join("\n");
    assert!(
        notices.contains("RUNTIME_ROOT: only read with CONFIG_TYPE=FILE"),
        "{notices}"
    );
}

#[test]
fn bad_xds_settings_are_refused_naming_the_variable() {
    for (name, value) in [
        ("CONFIG_GRPC_XDS_SERVER_URL", "http://eg:18001"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "eg"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0"),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0ms"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "yes"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "-1s"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "-0.5"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "half"),
        ("XDS_CLIENT_BACKOFF_JITTER", "maybe"),
        ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1"),
    ] {
        let err = settings(&[("CONFIG_TYPE", "GRPC_XDS_SOTW"), (name, value)]).unwrap_err();
        assert_eq!(err.name, name, "{name}={value}: {err}");
    }
    // Files are read at start: a missing one is refused, named.
    for name in [
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    ] {
        let mut vars = vec![
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            (name, "/nonexistent/x.pem"),
        ];
        if name.ends_with("_CERT") {
            vars.push(("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/nonexistent/k.pem"));
        }
        let err = settings(&vars).unwrap_err();
        assert_eq!(err.name, name, "{err}");
        assert!(err.message.contains("/nonexistent/x.pem"), "{err}");
    }
    // Without CONFIG_TYPE=GRPC_XDS_SOTW they are not read (only named).
    let s = settings(&[("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon")]).unwrap();
    assert!(s.notices[0].contains("only read with CONFIG_TYPE=GRPC_XDS_SOTW"));
}

/// Settings the chosen mode does not read are named at start: Redis ones
/// with the memory store, header names without the headers; and in range
/// they load (`STATSD_PORT` 1 and 65535, any header token).
#[test]
fn settings_the_mode_does_not_read_are_named_and_edges_in_range_load() {
    let s = settings(&[
        ("BACKEND_TYPE", "memory"),
        ("REDIS_URL", "127.0.0.1:6379"),
        ("REDIS_TIMEOUT", "banana"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
    ])
    .unwrap();
    let notices = s.notices.join("\n");
    for said in [
        "REDIS_URL, REDIS_TIMEOUT: only read with BACKEND_TYPE=redis",
        "LIMIT_RESET_HEADER: only read with LIMIT_RESPONSE_HEADERS_ENABLED=true",
    ] {
        assert!(notices.contains(said), "{notices}");
    }
    for port in ["1", "65535"] {
        let s = settings(&[("USE_STATSD", "true"), ("STATSD_PORT", port)]).unwrap();
        assert_eq!(s.statsd.unwrap().port.to_string(), port);
    }
    let s = settings(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_LIMIT_HEADER", "x-rl~limit"),
    ])
    .unwrap();
    assert_eq!(s.response_headers.unwrap()[0], "x-rl~limit");
}
