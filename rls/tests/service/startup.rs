//! What the binary says when it starts, at the default `LOG_LEVEL` (WARN):
//! one INFO line with the backend, the configuration, its domains and
//! limits, and the listeners; a warning when there is no configuration;
//! nothing that claims what is not configured.

use crate::process::{free_port, Proc};
use crate::support::Dir;

const API: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n";
const WEB: &str = "domain: web\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// Loopback listeners on free ports, statsd off, and `env`.
fn env(root: &str, extra: &[(&'static str, &str)]) -> (Vec<(&'static str, String)>, u16) {
    let grpc = free_port();
    let mut v: Vec<(&'static str, String)> = vec![
        ("RUNTIME_ROOT", root.into()),
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", free_port().to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", free_port().to_string()),
        ("USE_STATSD", "false".into()),
    ];
    v.extend(extra.iter().map(|(k, val)| (*k, (*val).to_owned())));
    (v, grpc)
}

fn spawn(vars: &[(&'static str, String)]) -> Proc {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Proc::spawn(&vars)
}

fn started(l: &str) -> bool {
    l.contains("throttle-rls started")
}

#[cfg(unix)]
#[tokio::test]
async fn one_info_line_names_backend_configuration_limits_and_ports() {
    let dir = Dir::new();
    dir.write("api.yaml", API);
    dir.write("web.yaml", WEB);
    let (vars, grpc) = env(dir.0.to_str().unwrap(), &[]);
    let mut p = spawn(&vars);
    let line = p.line(started).await;
    for said in [
        " INFO ",
        "backend memory (per process, not shared between replicas",
        &format!("configuration files in {}", dir.config().display()),
        "2 domains (api, web), 3 limits",
        &format!("gRPC 127.0.0.1:{grpc} (plain text)"),
        "(/json, /healthcheck)",
        "Prometheus off; statsd off",
    ] {
        assert!(line.contains(said), "no {said:?} in {line}");
    }
    assert!(
        !line.contains('\u{1b}'),
        "no colours off a terminal: {line:?}"
    );
    assert_eq!(p.terminate().await.code(), Some(0));
    assert!(p
        .lines
        .iter()
        .any(|l| l.contains(" INFO ") && l.contains("shutting down")));
    // Nothing at WARN: nothing is wrong.
    let warned: Vec<&String> = p.lines.iter().filter(|l| l.contains(" WARN ")).collect();
    assert!(warned.is_empty(), "{warned:?}");
}

#[cfg(unix)]
#[tokio::test]
async fn a_missing_or_empty_configuration_is_a_loud_warning() {
    let dir = Dir::new();
    let missing = dir.0.join("nowhere");
    let (vars, _) = env(missing.to_str().unwrap(), &[]);
    let mut p = spawn(&vars);
    let line = p.line(started).await;
    assert!(line.contains(": no domain;"), "{line}");
    let warning = p.line(|l| l.contains(" WARN ")).await;
    assert!(
        warning.contains("no rate-limit configuration") && warning.contains("does not exist"),
        "{warning}"
    );
    // An existing directory without a domain.
    let (vars, _) = env(dir.0.to_str().unwrap(), &[]);
    let mut p = spawn(&vars);
    let warning = p.line(|l| l.contains(" WARN ")).await;
    assert!(
        warning.contains("has no *.yaml file with a domain"),
        "{warning}"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn settings_that_change_nothing_are_named_at_start() {
    let dir = Dir::new();
    dir.write("web.yaml", WEB);
    let extra = [
        ("REDIS_POOL_SIZE", "20"),
        ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ("STATSD_HOST", "statsd"),
    ];
    let (vars, _) = env(dir.0.to_str().unwrap(), &extra);
    let mut p = spawn(&vars);
    p.line(started).await;
    for said in [
        "REDIS_POOL_SIZE: no effect",
        "LOCAL_CACHE_SIZE_IN_BYTES: no effect",
        "STATSD_HOST: only read when statsd is on",
    ] {
        let l = p.line(|l| l.contains(said)).await;
        assert!(l.contains(" WARN "), "{l}");
    }
}

/// Redis on a port nobody listens on: with no fallback configured, no
/// line may say a fallback store decides; with one, the fallback store
/// says so itself when it takes over (the Redis store never claims it).
#[cfg(unix)]
#[tokio::test]
async fn no_fallback_is_claimed_where_none_is_configured() {
    let dir = Dir::new();
    dir.write("web.yaml", WEB);
    let url = format!("127.0.0.1:{}", free_port());
    let mut with_url = vec![
        ("BACKEND_TYPE", "redis"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", url.as_str()),
    ];
    let (vars, _) = env(dir.0.to_str().unwrap(), &with_url);
    let mut p = spawn(&vars);
    let line = p.line(started).await;
    assert!(
        line.contains("while Redis is down calls are answered UNAVAILABLE"),
        "{line}"
    );
    // The store's health probe has failed twice (a second apart), so the
    // first connection attempts were logged (or dropped) by now.
    let probe = |l: &str| l.contains("unhealthy") || l.contains("does not answer");
    p.line(probe).await;
    p.next_line(probe).await;
    let claims: Vec<&String> = p
        .drain()
        .iter()
        .filter(|l| l.contains("fallback"))
        .collect();
    assert!(claims.is_empty(), "{claims:?}");

    with_url.push(("RLS_REDIS_FALLBACK", "memory"));
    let (vars, _) = env(dir.0.to_str().unwrap(), &with_url);
    let mut p = spawn(&vars);
    let line = p.line(started).await;
    assert!(
        line.contains("a per-process memory store decides"),
        "{line}"
    );
    p.line(|l| l.contains("fallback store decides")).await;
}

/// A first configuration that does not load: nothing claims a previous one.
#[cfg(unix)]
#[tokio::test]
async fn a_bad_first_configuration_claims_no_previous_one() {
    let dir = Dir::new();
    dir.write("web.yaml", "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    let (vars, _) = env(dir.0.to_str().unwrap(), &[]);
    let debug: u16 = vars
        .iter()
        .find(|(k, _)| *k == "DEBUG_PORT")
        .unwrap()
        .1
        .parse()
        .unwrap();
    let mut p = spawn(&vars);
    let line = p.line(started).await;
    assert!(line.contains(": none loaded (config/web.yaml:4:"), "{line}");
    let error = p.line(|l| l.contains(" ERROR ")).await;
    assert!(error.contains("none is in force"), "{error}");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], debug));
    let (_, _, dump) = crate::support::http(addr, "GET", "/rlconfig", "").await;
    assert!(
        dump.starts_with(
            "last configuration load failed, no configuration loaded: config/web.yaml:4:"
        ),
        "{dump}"
    );
    assert!(
        !p.drain().iter().any(|l| l.contains("previous")),
        "{:?}",
        p.lines
    );
}
