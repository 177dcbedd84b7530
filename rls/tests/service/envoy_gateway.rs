//! The binary with the environment Envoy Gateway's rate-limit Deployment
//! sets (envoyproxy/gateway `internal/infrastructure/kubernetes/ratelimit/
//! resource.go`), verbatim but for: `CONFIG_TYPE` (xDS comes later, so
//! the configuration is a file where xDS would put it), the listeners
//! (loopback, free ports) and the file paths (a temp directory laid out as
//! the Deployment's `/data`, `/certs`, `/redis-certs` and
//! `/etc/statsd-exporter`). Answers come over TLS; Prometheus is named by
//! Envoy Gateway's mapping file.

use std::net::SocketAddr;

use crate::process::{free_port, until_healthy, Proc};
use crate::redis::redis_support::{free_port as redis_port, RedisServer};
use crate::stats::GATEWAY_MAPPER;
use crate::support::*;
use crate::tls::{call_with, id};
use crate::tls_pki::Pki;

/// A rule as Envoy Gateway's translator writes one (upper-case unit).
const CONFIG: &str = "domain: default/eg/http
descriptors:
  - key: httproute/default/backend/rule/0/match/0/example_com
    value: httproute/default/backend/rule/0/match/0/example_com
    descriptors:
      - key: rule-0-match-0
        value: rule-0-match-0
        rate_limit: {unit: HOUR, requests_per_unit: 3}
";

const ROUTE: &str = "httproute/default/backend/rule/0/match/0/example_com";

struct Layout {
    root: Dir,
    grpc: u16,
    http: u16,
    metrics: u16,
}

impl Layout {
    /// `/data/ratelimit/config`, `/certs/{tls.crt,tls.key,ca.crt}`, the
    /// mapper file; a dotfile that would not load is ignored as asked.
    fn new(pki: &Pki) -> Layout {
        let root = Dir::new();
        let config = root.0.join("data/ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("default-eg-http.yaml"), CONFIG).unwrap();
        std::fs::write(config.join(".swap.yaml"), "not: [a config").unwrap();
        let certs = root.0.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        for (from, to) in [
            ("server.crt", "tls.crt"),
            ("server.key", "tls.key"),
            ("ca.crt", "ca.crt"),
        ] {
            std::fs::write(certs.join(to), pki.read(from)).unwrap();
        }
        std::fs::write(root.0.join("conf.yaml"), GATEWAY_MAPPER).unwrap();
        Layout {
            root,
            grpc: free_port(),
            http: free_port(),
            metrics: free_port(),
        }
    }

    fn path(&self, p: &str) -> String {
        self.root.0.join(p).display().to_string()
    }

    /// Envoy Gateway's variables, then `redis`.
    fn env(
        &self,
        redis_url: &str,
        redis: &[(&'static str, String)],
    ) -> Vec<(&'static str, String)> {
        let mut v: Vec<(&'static str, String)> = vec![
            ("RUNTIME_ROOT", self.path("data")),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
            ("RUNTIME_IGNOREDOTFILES", "true".into()),
            ("RUNTIME_WATCH_ROOT", "false".into()),
            ("LOG_LEVEL", "info".into()),
            ("USE_STATSD", "false".into()),
            // ("CONFIG_TYPE", "GRPC_XDS_SOTW"): xDS is not served yet.
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001".into()),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
            ("GRPC_SERVER_USE_TLS", "true".into()),
            ("GRPC_SERVER_TLS_CERT", self.path("certs/tls.crt")),
            ("GRPC_SERVER_TLS_KEY", self.path("certs/tls.key")),
            ("GRPC_SERVER_TLS_CA_CERT", self.path("certs/ca.crt")),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            (
                "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                self.path("certs/tls.crt"),
            ),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", self.path("certs/tls.key")),
            (
                "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                self.path("certs/ca.crt"),
            ),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("REDIS_SOCKET_TYPE", "tcp".into()),
            ("REDIS_URL", redis_url.into()),
            ("USE_PROMETHEUS", "true".into()),
            // Envoy Gateway: ":19001".
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", self.metrics)),
            ("PROMETHEUS_MAPPER_YAML", self.path("conf.yaml")),
            ("TRACING_ENABLED", "true".into()),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit".into()),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system".into()),
            (
                "TRACING_SERVICE_INSTANCE_ID",
                "envoy-ratelimit-5d4f8-abcde".into(),
            ),
            ("TRACING_SAMPLING_RATE", "1.0".into()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://otel-collector.monitoring:4318".into(),
            ),
            // Envoy Gateway's ports are 8081, 8080 and 6070.
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", self.grpc.to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", self.http.to_string()),
            ("DEBUG_HOST", "127.0.0.1".into()),
            ("DEBUG_PORT", free_port().to_string()),
        ];
        v.extend(redis.iter().cloned());
        v
    }

    fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }
}

fn spawn(vars: &[(&'static str, String)]) -> Proc {
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Proc::spawn(&vars)
}

/// Envoy's request for the route: OK three times, then over the limit.
async fn three_then_over(layout: &Layout, pki: &Pki) {
    let req = || {
        request(
            "default/eg/http",
            vec![d(&[(ROUTE, ROUTE), ("rule-0-match-0", "rule-0-match-0")])],
        )
    };
    let grpc = layout.addr(layout.grpc);
    let ca = pki.read("ca.crt");
    // Envoy Gateway's Envoy shows its certificate; nothing asks for one.
    for (i, identity) in [id(pki, "client"), None, None].into_iter().enumerate() {
        let r = call_with(grpc, &ca, identity, req())
            .await
            .expect("an answer over TLS");
        assert_eq!(codes(&r), vec![(OK, 2 - i as u32)]);
    }
    let r = call_with(grpc, &ca, None, req()).await.unwrap();
    assert_eq!(codes(&r), vec![(OVER, 0)]);
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_environment_serves_over_tls() {
    let pki = Pki::new();
    let redis = RedisServer::start();
    let layout = Layout::new(&pki);
    let vars = layout.env(&format!("127.0.0.1:{}", redis.port), &[]);
    let mut p = spawn(&vars);
    let line = p.line(|l| l.contains("throttle-rls started")).await;
    for said in [
        &format!("backend Redis SINGLE at 127.0.0.1:{} (tcp)", redis.port),
        "1 domain (default/eg/http), 1 limit",
        &format!(
            "gRPC 127.0.0.1:{} (TLS, no client certificate asked for)",
            layout.grpc
        ),
        &format!("Prometheus 127.0.0.1:{}/metrics named by", layout.metrics),
        "statsd off",
    ] {
        assert!(line.contains(said), "no {said:?} in {line}");
    }
    for said in [
        "CONFIG_GRPC_XDS_NODE_ID, CONFIG_GRPC_XDS_SERVER_URL, CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "GRPC_SERVER_TLS_CA_CERT: not read, as upstream does not read it",
        "TRACING_ENABLED, TRACING_SERVICE_NAME",
    ] {
        let l = p.line(|l| l.contains(said)).await;
        assert!(l.contains(" WARN "), "{l}");
    }
    until_healthy(layout.addr(layout.http)).await;
    three_then_over(&layout, &pki).await;
    let (status, _, text) = http(layout.addr(layout.metrics), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    let labels = format!(
        "domain=\"default/eg/http\",key1=\"{ROUTE}_{ROUTE}\",key2=\"rule-0-match-0_rule-0-match-0\""
    );
    for line in [
        format!("ratelimit_service_rate_limit_total_hits{{{labels}}} 4"),
        format!("ratelimit_service_rate_limit_over_limit{{{labels}}} 1"),
        format!("ratelimit_service_rate_limit_within_limit{{{labels}}} 3"),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
    assert_eq!(p.terminate().await.code(), Some(0));
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateways_redis_tls_client_certificate() {
    let pki = Pki::new();
    let tls_port = redis_port(false);
    let args: Vec<String> = [
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &pki.path("server.crt"),
        "--tls-key-file",
        &pki.path("server.key"),
        "--tls-ca-cert-file",
        &pki.path("ca.crt"),
        "--tls-auth-clients",
        "yes",
    ]
    .map(String::from)
    .to_vec();
    let _redis = RedisServer::start_with_args(&args);
    let layout = Layout::new(&pki);
    // Envoy Gateway's /redis-certs, and (not set by Envoy Gateway, whose
    // Redis certificates chain to the system's roots) the test CA.
    let redis_tls = [
        ("REDIS_TLS", "true".to_owned()),
        ("REDIS_TLS_CLIENT_CERT", pki.path("client.crt")),
        ("REDIS_TLS_CLIENT_KEY", pki.path("client.key")),
        ("REDIS_TLS_CACERT", pki.path("ca.crt")),
    ];
    let vars = layout.env(&format!("127.0.0.1:{tls_port}"), &redis_tls);
    let mut p = spawn(&vars);
    let line = p.line(|l| l.contains("throttle-rls started")).await;
    assert!(
        line.contains("(tcp, TLS with a client certificate)"),
        "{line}"
    );
    until_healthy(layout.addr(layout.http)).await;
    three_then_over(&layout, &pki).await;
    assert_eq!(p.terminate().await.code(), Some(0));
}
