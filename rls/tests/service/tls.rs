//! gRPC over TLS as upstream serves it (`GRPC_SERVER_USE_TLS`), asked by a
//! real tonic TLS client: no client certificate asked for without
//! `GRPC_CLIENT_TLS_CACERT`; with it, one from that CA required; with
//! `GRPC_CLIENT_TLS_SAN`, one valid for that name; certificate files read
//! again when they change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use throttle_rls::backend::TestHooks;
use throttle_rls::server::{start, Running, StartError};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tower_throttle::clock::ManualClock;

use crate::support::*;
use crate::tls_pki::Pki;

const CFG: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// A memory-store server over TLS with `env` added to the TLS settings.
async fn start_tls(pki: &Pki, env: &[(&str, &str)]) -> (Dir, Result<Running, StartError>) {
    let dir = Dir::new();
    dir.write("d.yaml", CFG);
    let (cert, key) = (pki.path("server.crt"), pki.path("server.key"));
    let mut vars = vec![
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", cert.as_str()),
        ("GRPC_SERVER_TLS_KEY", key.as_str()),
    ];
    vars.extend_from_slice(env);
    let settings = settings(&dir, &vars);
    let hooks = TestHooks {
        clock: Some(Arc::new(ManualClock::starting_at(T0 * 1_000_000_000))),
        store: None,
    };
    let running = start(&settings, hooks).await;
    (dir, running)
}

/// One `ShouldRateLimit` over TLS trusting `ca`, showing `identity` if
/// given: the status codes, or why the connection or the call failed.
pub async fn call(
    addr: SocketAddr,
    ca: &[u8],
    identity: Option<(Vec<u8>, Vec<u8>)>,
) -> Result<Vec<i32>, String> {
    let req = request("d", vec![d(&[("k", "v")])]);
    let answer = call_with(addr, ca, identity, req).await?;
    Ok(answer.statuses.iter().map(|s| s.code).collect())
}

/// The same for any request: the answer, or why there is none.
pub async fn call_with(
    addr: SocketAddr,
    ca: &[u8],
    identity: Option<(Vec<u8>, Vec<u8>)>,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let attempt = async {
        let channel = Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| e.to_string())?
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let answer = RateLimitServiceClient::new(channel)
            .should_rate_limit(req)
            .await
            .map_err(|s| format!("call: {s:?}"))?;
        Ok(answer.into_inner())
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .unwrap_or_else(|_| Err("timed out".into()))
}

pub fn id(pki: &Pki, name: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    Some((
        pki.read(&format!("{name}.crt")),
        pki.read(&format!("{name}.key")),
    ))
}

#[tokio::test]
async fn tls_without_a_client_ca_asks_no_certificate() {
    let pki = Pki::new();
    let (_dir, running) = start_tls(&pki, &[]).await;
    let running = running.expect("starts");
    let addr = running.grpc_addr;
    let ca = pki.read("ca.crt");
    assert_eq!(call(addr, &ca, None).await, Ok(vec![OK]));
    assert_eq!(call(addr, &ca, id(&pki, "stranger")).await, Ok(vec![OK]));
    // A client that does not trust the server's CA, and a plain-text one.
    let untrusting = call(addr, &pki.read("ca2.crt"), None).await;
    assert!(untrusting.is_err(), "{untrusting:?}");
    let plain = RateLimitServiceClient::connect(format!("http://{addr}")).await;
    if let Ok(mut client) = plain {
        let r = client
            .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
            .await;
        assert!(r.is_err(), "plain text answered: {r:?}");
    }
    running.shutdown();
    running.wait().await;
}

#[tokio::test]
async fn client_certificates_required_with_a_client_ca() {
    let pki = Pki::new();
    let ca_path = pki.path("ca.crt");
    let (_dir, running) = start_tls(&pki, &[("GRPC_CLIENT_TLS_CACERT", &ca_path)]).await;
    let running = running.expect("starts");
    let (addr, ca) = (running.grpc_addr, pki.read("ca.crt"));
    assert_eq!(call(addr, &ca, id(&pki, "client")).await, Ok(vec![OK]));
    let without = call(addr, &ca, None).await;
    assert!(without.is_err(), "no certificate, yet {without:?}");
    let stranger = call(addr, &ca, id(&pki, "stranger")).await;
    assert!(
        stranger.is_err(),
        "another CA's certificate, yet {stranger:?}"
    );
    running.shutdown();
    running.wait().await;
}

#[tokio::test]
async fn the_client_san_is_checked_as_upstream_checks_it() {
    let pki = Pki::new();
    let ca_path = pki.path("ca.crt");
    let env = [
        ("GRPC_CLIENT_TLS_CACERT", ca_path.as_str()),
        ("GRPC_CLIENT_TLS_SAN", "Envoy.Example.com"),
    ];
    let (_dir, running) = start_tls(&pki, &env).await;
    let running = running.expect("starts");
    let (addr, ca) = (running.grpc_addr, pki.read("ca.crt"));
    // DNS names compare case-insensitively; a wildcard SAN covers one label.
    assert_eq!(call(addr, &ca, id(&pki, "client")).await, Ok(vec![OK]));
    assert_eq!(call(addr, &ca, id(&pki, "wildcard")).await, Ok(vec![OK]));
    let intruder = call(addr, &ca, id(&pki, "intruder")).await;
    assert!(intruder.is_err(), "wrong SAN, yet {intruder:?}");
    let stranger = call(addr, &ca, id(&pki, "stranger")).await;
    assert!(stranger.is_err(), "right SAN, wrong CA, yet {stranger:?}");
    assert!(call(addr, &ca, None).await.is_err());
    running.shutdown();
    running.wait().await;
}

#[tokio::test]
async fn certificate_files_are_read_again_when_they_change() {
    let pki = Pki::new();
    let files = Dir::new();
    let (cert, key) = (files.0.join("tls.crt"), files.0.join("tls.key"));
    std::fs::write(&cert, pki.read("server.crt")).unwrap();
    std::fs::write(&key, pki.read("server.key")).unwrap();
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let env = [
        ("GRPC_SERVER_TLS_CERT", cert_s.as_str()),
        ("GRPC_SERVER_TLS_KEY", key_s.as_str()),
    ];
    let (_dir, running) = start_tls(&pki, &env).await;
    let running = running.expect("starts");
    let tls = running.tls.clone().expect("TLS is on");
    let addr = running.grpc_addr;
    let (ca, ca2) = (pki.read("ca.crt"), pki.read("ca2.crt"));
    assert_eq!(call(addr, &ca, None).await, Ok(vec![OK]));
    assert!(tls.check().is_none(), "nothing changed yet");
    // A rotated certificate, from another CA: new connections see it.
    std::fs::write(&cert, pki.read("server2.crt")).unwrap();
    std::fs::write(&key, pki.read("server2.key")).unwrap();
    assert_eq!(tls.check(), Some(Ok(())));
    assert!(call(addr, &ca, None).await.is_err());
    assert_eq!(call(addr, &ca2, None).await, Ok(vec![OK]));
    // A broken key is refused and the certificate in force stays.
    std::fs::write(&key, "not a key").unwrap();
    let err = tls.check().unwrap().unwrap_err().to_string();
    assert!(err.contains("GRPC_SERVER_TLS_KEY"), "{err}");
    assert!(
        tls.check().is_none(),
        "a failed set is not retried unchanged"
    );
    assert_eq!(call(addr, &ca2, None).await, Ok(vec![OK]));
    running.shutdown();
    running.wait().await;
}

#[tokio::test]
async fn unusable_tls_files_stop_the_start_naming_the_variable() {
    let pki = Pki::new();
    let missing = pki.path("missing.crt");
    let (_d, r) = start_tls(&pki, &[("GRPC_SERVER_TLS_CERT", &missing)]).await;
    let err = r.err().expect("refused").to_string();
    assert!(
        err.contains("GRPC_SERVER_TLS_CERT") && err.contains("missing.crt"),
        "{err}"
    );
    let other_key = pki.path("server2.key");
    let (_d, r) = start_tls(&pki, &[("GRPC_SERVER_TLS_KEY", &other_key)]).await;
    let err = r.err().expect("refused").to_string();
    assert!(err.contains("GRPC_SERVER_TLS_KEY"), "{err}");
    let not_pem = pki.path("client.ext");
    let (_d, r) = start_tls(&pki, &[("GRPC_CLIENT_TLS_CACERT", &not_pem)]).await;
    let err = r.err().expect("refused").to_string();
    assert!(err.contains("GRPC_CLIENT_TLS_CACERT"), "{err}");
}

#[cfg(unix)]
#[tokio::test]
async fn tls_on_a_unix_socket_too() {
    let pki = Pki::new();
    let socket_dir = Dir::new();
    let socket = socket_dir.0.join("rls.sock");
    let uds = socket.display().to_string();
    let ca_path = pki.path("ca.crt");
    let env = [
        ("GRPC_UDS", uds.as_str()),
        ("GRPC_CLIENT_TLS_CACERT", ca_path.as_str()),
    ];
    let (_dir, running) = start_tls(&pki, &env).await;
    let running = running.expect("starts");
    let connect = |identity: Option<(Vec<u8>, Vec<u8>)>| {
        let path = socket.clone();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pki.read("ca.crt")))
            .domain_name("localhost");
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        async move {
            let channel = Endpoint::from_static("https://localhost")
                .tls_config(tls)
                .map_err(|e| e.to_string())?
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| format!("connect: {e:?}"))?;
            RateLimitServiceClient::new(channel)
                .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
                .await
                .map(|r| codes(&r.into_inner()))
                .map_err(|s| format!("call: {s:?}"))
        }
    };
    assert_eq!(connect(id(&pki, "client")).await, Ok(vec![(OK, 99)]));
    let without = connect(None).await;
    assert!(without.is_err(), "no certificate, yet {without:?}");
    running.shutdown();
    running.wait().await;
}
