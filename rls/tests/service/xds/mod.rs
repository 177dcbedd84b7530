//! `CONFIG_TYPE=GRPC_XDS_SOTW`: the binary against a control plane the
//! test runs (a tonic ADS server on its own runtime, on a loopback port),
//! which pushes snapshots, records every DiscoveryRequest (ACK, NACK, the
//! node and the headers), goes away (its runtime dropped: every socket
//! closed) and comes back on the same port.

mod control_plane;
mod tls_files;

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitUnit;
use tonic::transport::ServerTlsConfig;

use crate::process::{free_port, until_healthy};
use crate::support::*;
use crate::tls_pki::Pki;
pub use control_plane::{day_limits, descriptor, resource, ControlPlane, Rls, TYPE_URL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_enforced_updated_and_bad_ones_nacked() {
    let cp = ControlPlane::start(Some(("1", day_limits(&[("k", 3), ("j", 2)]))), None);
    let mut rls = Rls::launch(
        cp.port,
        &[
            (
                "CONFIG_GRPC_XDS_NODE_METADATA",
                "cluster=rl,zone=z1,ignored",
            ),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "x-tenant:t1,X-Team:rl",
            ),
        ],
    );
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    let source = format!("configuration xDS server 127.0.0.1:{} (node id test-node, plain text): 1 domain (d), 2 limits", cp.port);
    assert!(line.contains(&source), "{line}");
    until_healthy(Rls::addr(rls.http)).await;
    // The first request: the node, its metadata, the headers, the type.
    let first = cp.wait_for(|_| true).await;
    assert_eq!(first.node_id, "test-node");
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!((first.version.as_str(), first.nonce.as_str()), ("", ""));
    let metadata: HashMap<String, String> = [("cluster", "rl"), ("zone", "z1")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    assert_eq!(first.metadata, metadata);
    assert_eq!(
        first.headers.get("x-tenant").map(String::as_str),
        Some("t1")
    );
    assert_eq!(first.headers.get("x-team").map(String::as_str), Some("rl"));
    let ack = cp.acked("1").await;
    assert_eq!(ack.nonce, cp.nonces_of("1")[0]);
    // Upstream's remaining counts: 2, 1, 0, then over.
    for left in [2, 1, 0] {
        assert_eq!(rls.ask("k").await.unwrap(), (OK, left));
    }
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.ask("j").await.unwrap(), (OK, 1));

    // An update: k unchanged (its count carries over), j raised, m new.
    cp.push("2", day_limits(&[("k", 3), ("j", 5), ("m", 1)]));
    cp.acked("2").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.ask("j").await.unwrap(), (OK, 3));
    assert_eq!(rls.ask("m").await.unwrap(), (OK, 0));
    assert_eq!(rls.ask("m").await.unwrap(), (OVER, 0));

    // Bad snapshots: NACKed with the last ACKed version and the reason;
    // the limits in force still answer and /rlconfig shows the error.
    let dup = vec![resource(
        "dup-config",
        "d",
        vec![
            descriptor("k", 9, RateLimitUnit::Day),
            descriptor("k", 9, RateLimitUnit::Day),
        ],
    )];
    let unknown = vec![resource(
        "unit-config",
        "d",
        vec![descriptor("k", 9, RateLimitUnit::Unknown)],
    )];
    let garbage = vec![Any {
        type_url: TYPE_URL.into(),
        value: vec![0xff, 0xff, 0xff, 0xff],
    }];
    for (version, resources, reason) in [
        (
            "3",
            dup,
            "dup-config: descriptors[1]: duplicate descriptor composite key 'k'",
        ),
        (
            "4",
            unknown,
            "unit-config: descriptors[0].rate_limit: invalid rate limit unit 'UNKNOWN'",
        ),
        (
            "5",
            garbage,
            "cannot decode a resource as ratelimit.config.ratelimit.v3.RateLimitConfig",
        ),
    ] {
        cp.push(version, resources);
        let nack = cp.nacked(version).await;
        assert_eq!(nack.version, "2", "{nack:?}");
        let error = nack.error.unwrap();
        assert!(error.contains(reason), "{error}");
        assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
        assert_eq!(rls.ask("j").await.unwrap().0, OK);
        let dump = rls.rlconfig().await;
        assert!(dump.contains("d.k: unit=DAY requests_per_unit=3"), "{dump}");
        assert!(
            dump.contains("last configuration load failed, previous configuration kept")
                && dump.contains(reason),
            "{dump}"
        );
        rls.p
            .line(|l| {
                l.contains("ERROR")
                    && l.contains("xDS snapshot refused (NACK)")
                    && l.contains(reason)
            })
            .await;
    }
    // A good one again: in force, the error gone.
    cp.push("6", day_limits(&[("k", 100)]));
    cp.acked("6").await;
    // k was asked 8 times (over the limit too counts, as upstream).
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 91));
    assert_eq!(
        rls.ask("j").await.unwrap(),
        (OK, 0),
        "no limit for j any more"
    );
    let dump = rls.rlconfig().await;
    assert!(!dump.contains("failed"), "{dump}");
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_goes_away_and_comes_back() {
    let mut cp = ControlPlane::start(Some(("1", day_limits(&[("k", 5)]))), None);
    let mut rls = Rls::launch(cp.port, &[]);
    until_healthy(Rls::addr(rls.http)).await;
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 4));
    cp.go_away();
    let lost = rls.p.line(|l| l.contains("lost the xDS server")).await;
    assert!(
        lost.contains("ERROR") && lost.contains("the configuration in force stays"),
        "{lost}"
    );
    // Meanwhile the last table answers; the client keeps trying.
    for left in [3, 2] {
        assert_eq!(rls.ask("k").await.unwrap(), (OK, left));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    // Back on the same port with a new snapshot.
    cp.push("2", day_limits(&[("k", 5), ("n", 1)]));
    cp.serve();
    let again = rls
        .p
        .line(|l| l.contains("connected to the xDS server again"))
        .await;
    assert!(again.contains("INFO"), "{again}");
    let ack = cp.acked("2").await;
    // As upstream's client, the new stream's first request carried the
    // version and nonce of the last response received.
    let reconnect = cp.wait_for(|s| s.stream == ack.stream).await;
    assert_eq!(reconnect.version, "1");
    assert_eq!(rls.ask("n").await.unwrap(), (OK, 0));
    assert_eq!(
        rls.ask("k").await.unwrap(),
        (OK, 0),
        "k's count carried over"
    );
    assert_eq!(rls.ask("k").await.unwrap(), (OVER, 0));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshot_updates_under_load() {
    const LIMIT: u32 = 60;
    const CALLS: usize = 240;
    const TASKS: usize = 12;
    let cp = ControlPlane::start(Some(("1", day_limits(&[("k", LIMIT), ("other", 1)]))), None);
    let mut rls = Rls::launch(cp.port, &[]);
    until_healthy(Rls::addr(rls.http)).await;
    cp.acked("1").await;
    let client = rls.client().await;
    let pushing = async {
        for v in 2..=12u32 {
            cp.push(&v.to_string(), day_limits(&[("k", LIMIT), ("other", v)]));
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    };
    let calling = async {
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u32;
                for _ in 0..CALLS / TASKS {
                    let r = client
                        .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
                        .await
                        .unwrap_or_else(|s| panic!("task {t}: {s:?}"))
                        .into_inner();
                    match codes(&r)[0].0 {
                        OK => ok += 1,
                        OVER => {}
                        other => panic!("code {other}"),
                    }
                }
                ok
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await.unwrap();
        }
        ok
    };
    let ((), admitted) = tokio::join!(pushing, calling);
    assert_eq!(admitted, LIMIT);
    cp.acked("12").await;
    assert_eq!(rls.ask("other").await.unwrap(), (OK, 11));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_serves_before_the_first_snapshot() {
    let mut cp = ControlPlane::later(free_port(), None);
    let mut rls = Rls::launch(cp.port, &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")]);
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(line.contains(": none yet"), "{line}");
    rls.p
        .line(|l| {
            l.contains("WARN") && l.contains("every request fails until the xDS server sends one")
        })
        .await;
    until_healthy(Rls::addr(rls.http)).await;
    // As upstream: no configuration, so the call fails.
    let e = rls.ask("k").await.unwrap_err();
    assert!(e.message().contains("no rate limit configuration"), "{e:?}");
    cp.push("1", day_limits(&[("k", 2)]));
    cp.serve();
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_nothing_listens_before_the_first_snapshot() {
    let mut cp = ControlPlane::later(free_port(), None);
    let mut rls = Rls::launch(cp.port, &[]);
    rls.p
        .line(|l| l.contains("waiting for the first rate-limit configuration"))
        .await;
    rls.p
        .line(|l| l.contains("cannot connect to the xDS server"))
        .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    for port in [rls.http, rls.grpc] {
        assert!(
            tokio::net::TcpStream::connect(Rls::addr(port))
                .await
                .is_err(),
            "port {port} answers before the first snapshot"
        );
    }
    assert!(!rls
        .p
        .drain()
        .iter()
        .any(|l| l.contains("throttle-rls started")));
    cp.push("1", day_limits(&[("k", 2)]));
    cp.serve();
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(line.contains("1 domain (d), 1 limit"), "{line}");
    until_healthy(Rls::addr(rls.http)).await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}

/// The control plane over TLS, asking for a client certificate `ca` issued.
pub fn mtls(pki: &Pki, cert: &str, key: &str) -> ServerTlsConfig {
    use tonic::transport::{Certificate, Identity};
    ServerTlsConfig::new()
        .identity(Identity::from_pem(pki.read(cert), pki.read(key)))
        .client_ca_root(Certificate::from_pem(pki.read("ca.crt")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_to_the_control_plane() {
    let pki = Pki::new();
    let cp = ControlPlane::start(
        Some(("1", day_limits(&[("k", 2)]))),
        Some(mtls(&pki, "server.crt", "server.key")),
    );
    let (cert, key, ca, ca2) = (
        pki.path("client.crt"),
        pki.path("client.key"),
        pki.path("ca.crt"),
        pki.path("ca2.crt"),
    );
    let tls = |ca: &str| -> Vec<(&'static str, String)> {
        vec![
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.clone()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.clone()),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca.to_owned()),
            // The certificate is for 127.0.0.1 and localhost.
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost".into()),
        ]
    };
    let good = tls(&ca);
    let env: Vec<(&str, &str)> = good.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::launch(cp.port, &env);
    let line = rls.p.line(|l| l.contains("throttle-rls started")).await;
    assert!(
        line.contains("TLS with a client certificate, server verified as localhost): 1 domain"),
        "{line}\n{}",
        rls.p.lines.join("\n")
    );
    cp.acked("1").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 1));
    assert_eq!(rls.p.terminate().await.code(), Some(0));

    // A CA that did not issue the server's certificate: refused, retried.
    let streams = cp.seen().len();
    let mut bad_env = tls(&ca2);
    bad_env.push(("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()));
    let env: Vec<(&str, &str)> = bad_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut rls = Rls::launch(cp.port, &env);
    let refused = rls
        .p
        .line(|l| l.contains("cannot connect to the xDS server"))
        .await;
    assert!(
        refused.contains("ERROR") && refused.to_lowercase().contains("certificate"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cp.seen().len(), streams, "no request got through");
    assert_eq!(rls.p.terminate().await.code(), Some(0));

    // No client certificate: the control plane refuses the handshake.
    let env: Vec<(&str, &str)> = vec![
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &ca),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];
    let mut rls = Rls::launch(cp.port, &env);
    rls.p
        .line(|l| {
            l.contains("lost the xDS server") || l.contains("cannot connect to the xDS server")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cp.seen().len(), streams, "no request got through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_above_the_max_message_size_is_not_received() {
    let big: Vec<(String, u32)> = (0..40).map(|i| (format!("key-{i:03}"), 5)).collect();
    let limits: Vec<(&str, u32)> = big.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    let cp = ControlPlane::start(Some(("1", day_limits(&limits))), None);
    let mut rls = Rls::launch(
        cp.port,
        &[
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "300"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    );
    let lost = rls.p.line(|l| l.contains("lost the xDS server")).await;
    assert!(lost.contains("too large"), "{lost}");
    assert!(!cp.nonces_of("1").is_empty());
    assert!(cp
        .seen()
        .iter()
        .all(|s| s.version.is_empty() && s.error.is_none()));
    // A small one passes.
    cp.push("2", day_limits(&[("k", 1)]));
    cp.acked("2").await;
    assert_eq!(rls.ask("k").await.unwrap(), (OK, 0));
    assert_eq!(rls.p.terminate().await.code(), Some(0));
}
