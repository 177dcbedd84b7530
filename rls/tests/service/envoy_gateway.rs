//! The binary with the environment Envoy Gateway's rate-limit Deployment
//! sets (envoyproxy/gateway `internal/infrastructure/kubernetes/ratelimit/
//! resource.go`), verbatim but for: `CONFIG_GRPC_XDS_SERVER_URL` (a control
//! plane the test runs, over mTLS as Envoy Gateway's xDS server, at
//! `localhost:<free port>`), the listeners (loopback, free ports) and the
//! file paths (a temp directory laid out as the Deployment's `/data`,
//! `/certs`, `/redis-certs` and `/etc/statsd-exporter`). As Envoy Gateway's
//! `/certs/tls.crt`, one certificate serves gRPC and is shown to the xDS
//! server. Answers come over TLS; Prometheus is named by Envoy Gateway's
//! mapping file.

use std::net::SocketAddr;

use crate::process::{free_port, until_healthy, Proc};
use crate::redis::redis_support::RedisServer;
use crate::stats::GATEWAY_MAPPER;
use crate::support::*;
use crate::tls::{call_with, id};
use crate::tls_pki::Pki;
use crate::xds::{resource, ControlPlane};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

const ROUTE: &str = "httproute/default/backend/rule/0/match/0/example_com";

/// A rule as Envoy Gateway's translator sends one (its xDS resource).
fn snapshot() -> Vec<envoy_types::pb::google::protobuf::Any> {
    let rule = RateLimitDescriptor {
        key: "rule-0-match-0".into(),
        value: "rule-0-match-0".into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Hour as i32,
            requests_per_unit: 3,
            ..Default::default()
        }),
        ..Default::default()
    };
    let route = RateLimitDescriptor {
        key: ROUTE.into(),
        value: ROUTE.into(),
        descriptors: vec![rule],
        ..Default::default()
    };
    vec![resource("default/eg/http", "default/eg/http", vec![route])]
}

/// A certificate for both ends (serverAuth and clientAuth, 127.0.0.1 and
/// localhost) by the test CA, as Envoy Gateway's `/certs/tls.crt`.
fn issue_both(pki: &Pki, dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("the openssl CLI");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        dir.join("tls.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        "-subj",
        "/CN=envoy-ratelimit",
    ]);
    let (ca, ca_key) = (pki.path("ca.crt"), pki.path("ca.key"));
    openssl(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "tls.crt",
        "-extfile",
        "tls.ext",
    ]);
}

struct Layout {
    root: Dir,
    grpc: u16,
    http: u16,
    metrics: u16,
    /// Envoy Gateway's xDS server for the rate-limit configuration.
    xds: ControlPlane,
}

impl Layout {
    /// `/data/ratelimit` (empty: the configuration comes over xDS),
    /// `/certs/{tls.crt,tls.key,ca.crt}`, the mapper file, and the xDS
    /// server (mTLS: it asks for a certificate the CA issued).
    fn new(pki: &Pki) -> Layout {
        let root = Dir::new();
        std::fs::create_dir_all(root.0.join("data/ratelimit")).unwrap();
        let certs = root.0.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::write(certs.join("ca.crt"), pki.read("ca.crt")).unwrap();
        issue_both(pki, &certs);
        std::fs::write(root.0.join("conf.yaml"), GATEWAY_MAPPER).unwrap();
        let read = |f: &str| std::fs::read(certs.join(f)).unwrap();
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(read("tls.crt"), read("tls.key")))
            .client_ca_root(Certificate::from_pem(read("ca.crt")));
        let xds = ControlPlane::start(Some(("1", snapshot())), Some(tls));
        Layout {
            root,
            grpc: free_port(),
            http: free_port(),
            metrics: free_port(),
            xds,
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
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            // Envoy Gateway: "envoy-gateway:18001".
            (
                "CONFIG_GRPC_XDS_SERVER_URL",
                format!("localhost:{}", self.xds.port),
            ),
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
    // FORCE_START_WITHOUT_INITIAL_CONFIG=true: it may start before the
    // snapshot is in.
    for said in [
        &format!("backend Redis SINGLE at 127.0.0.1:{} (tcp)", redis.port),
        &format!(
            "configuration xDS server localhost:{} (node id envoy-ratelimit, TLS with a client certificate)",
            layout.xds.port
        ),
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
        "RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_WATCH_ROOT, RUNTIME_IGNOREDOTFILES: only read with CONFIG_TYPE=FILE",
        "GRPC_SERVER_TLS_CA_CERT: not read, as upstream does not read it",
        "TRACING_ENABLED, TRACING_SERVICE_NAME",
    ] {
        let l = p.line(|l| l.contains(said)).await;
        assert!(l.contains(" WARN "), "{l}");
    }
    until_healthy(layout.addr(layout.http)).await;
    let ack = layout.xds.acked("1").await;
    assert_eq!(ack.node_id, "envoy-ratelimit");
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
    let (tls_port, _redis) = crate::redis::tls_server(
        &pki.path("server.crt"),
        &pki.path("server.key"),
        &pki.path("ca.crt"),
        true,
    );
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
    layout.xds.acked("1").await;
    three_then_over(&layout, &pki).await;
    assert_eq!(p.terminate().await.code(), Some(0));
}
