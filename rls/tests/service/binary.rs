//! The `throttle-rls` binary: bad settings exit non-zero with the variable
//! named; SIGTERM turns health off and exits cleanly.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::free_port;
use crate::support::*;

const BIN: &str = env!("CARGO_BIN_EXE_throttle-rls");

#[test]
fn bad_settings_exit_non_zero_naming_the_variable() {
    for (name, value) in [
        ("GRPC_PORT", "eighty"),
        ("SHADOW_MODE", "perhaps"),
        ("BACKEND_TYPE", "memcache"),
    ] {
        let out = Command::new(BIN)
            .env(name, value)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name) && !err.contains("panicked"), "{err}");
    }
}

/// A value that is not UTF-8 is refused by name, never read as unset: here
/// TLS asked for with bytes the service cannot read (unset would serve
/// plain text), and an unsupported feature behind bytes that would hide it.
#[cfg(unix)]
#[test]
fn a_value_that_is_not_utf8_is_refused_naming_the_variable() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for (name, value) in [
        ("GRPC_SERVER_USE_TLS", &b"tru\xffe"[..]),
        ("REDIS_PERSECOND", b"\xc3\x28"),
        ("RLS_LEASES", b"\xff"),
    ] {
        // A bad port too: were the bytes read as unset, the service would
        // stop on the port instead (and not start serving).
        let out = Command::new(BIN)
            .env(name, OsStr::from_bytes(value))
            .env("GRPC_PORT", "eighty")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name) && err.contains("UTF-8"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_fails_health_then_exits_cleanly() {
    let dir = Dir::new();
    dir.write("d.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n");
    let (grpc, port, debug) = (free_port(), free_port(), free_port());
    let mut child = Command::new(BIN)
        .env("RUNTIME_ROOT", &dir.0)
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the binary did not start listening"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(http(addr, "GET", "/healthcheck", "").await.0, 200);
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    assert_eq!(http(addr, "POST", "/json", body).await.0, 200);
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}");
}

#[cfg(unix)]
#[tokio::test]
async fn grpc_on_a_unix_socket_with_grpc_uds() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let dir = Dir::new();
    dir.write("d.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n");
    let socket = dir.0.join("rls.sock");
    let settings = settings(&dir, &[("GRPC_UDS", socket.to_str().unwrap())]);
    let running = throttle_rls::server::start(&settings, Default::default())
        .await
        .unwrap();
    let path = socket.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let r = client
        .should_rate_limit(request("d", vec![d(&[("k", "v")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&r), vec![(OK, 4)]);
    running.shutdown();
    running.wait().await;
}
