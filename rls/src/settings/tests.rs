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
        ("LOG_LEVEL", "loud"),
        ("RLS_MAX_DESCRIPTORS", "0"),
        ("RLS_RELOAD_INTERVAL", "0"),
    ] {
        let mut vars = vec![(name, value)];
        if name.starts_with("REDIS") {
            vars.push(("REDIS_URL", "127.0.0.1:1"));
        }
        let err = settings(&vars).unwrap_err();
        assert_eq!(err.name, name, "{err}");
    }
}

#[test]
fn unsupported_upstream_features_are_refused_at_start() {
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("BACKEND_TYPE", "memcache"),
        ("REDIS_PERSECOND", "true"),
        ("GRPC_SERVER_USE_TLS", "true"),
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
}
