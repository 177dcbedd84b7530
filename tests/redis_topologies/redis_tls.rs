//! `rediss://` against a real `redis-server --tls-port`, with certificates
//! made at test time by the `openssl` CLI: the server's certificate is
//! verified against the test CA (features `redis` and `tls`).

use crate::redis_support;

use crate::pki;
use pki::Pki;

use std::process::Command;
use std::time::Duration;

use redis_support::{current_thread_runtime as runtime, free_port, RedisServer};
use tower_throttle::store::redis::{RedisStore, RedisStoreBuilder};
use tower_throttle::store::CellStore;
use tower_throttle::{Limiter, Policy, Store, StoreError};

/// `redis-server` arguments for a TLS port beside the plain one (the
/// harness waits on the plain port; the stores use only the TLS one).
trait RedisTls {
    fn server_args(&self, tls_port: u16, auth_clients: bool) -> Vec<String>;
}

impl RedisTls for Pki {
    fn server_args(&self, tls_port: u16, auth_clients: bool) -> Vec<String> {
        [
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &self.path("server.crt"),
            "--tls-key-file",
            &self.path("server.key"),
            "--tls-ca-cert-file",
            &self.path("ca.crt"),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ]
        .map(String::from)
        .to_vec()
    }
}

fn builder() -> RedisStoreBuilder {
    RedisStore::builder().timeout(Duration::from_secs(2))
}

fn policy() -> Policy {
    Policy::cell(4, 10, Duration::from_secs(60)).unwrap()
}

/// Five admitted (burst 4 + 1), then denied: decisions come back over TLS.
async fn five_then_denied(store: RedisStore) {
    let limiter = Limiter::new(store, policy());
    for i in 0..5 {
        assert!(limiter.check("tls").await.unwrap().allowed, "check {i}");
    }
    assert!(!limiter.check("tls").await.unwrap().allowed);
}

#[test]
fn rediss_verified_against_the_test_ca() {
    let pki = Pki::new();
    let tls_port = free_port(false);
    let _server = RedisServer::start_with_args(&pki.server_args(tls_port, false));
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    runtime().block_on(async {
        let store = builder()
            .tls_root_cert(pki.read("ca.crt"))
            .connect(url.as_str())
            .await
            .unwrap();
        // The connect-time checks ran over TLS.
        assert_eq!(store.server_eviction_policy(), Some("noeviction"));
        five_then_denied(store).await;
        // The system's roots do not know the test CA: verification is real.
        let err = builder().connect(url.as_str()).await.unwrap_err();
        assert!(matches!(err, StoreError::Connection(_)), "{err:?}");
        // Plain text to the TLS port is no Redis either.
        let plain = format!("redis://127.0.0.1:{tls_port}/");
        assert!(builder().connect(plain.as_str()).await.is_err());
    });
}

#[test]
fn rediss_with_a_client_certificate() {
    let pki = Pki::new();
    let tls_port = free_port(false);
    let _server = RedisServer::start_with_args(&pki.server_args(tls_port, true));
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    runtime().block_on(async {
        let store = builder()
            .tls_root_cert(pki.read("ca.crt"))
            .tls_client_cert(pki.read("client.crt"), pki.read("client.key"))
            .connect(url.as_str())
            .await
            .unwrap();
        five_then_denied(store).await;
        let err = builder()
            .tls_root_cert(pki.read("ca.crt"))
            .connect(url.as_str())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Connection(_) | StoreError::Timeout(_)),
            "{err:?}"
        );
    });
}

/// The redis-cell store connects through the same path: over TLS it gets as
/// far as asking for the module (not loaded here), past TLS and the checks.
#[test]
fn cell_store_connects_over_tls() {
    let pki = Pki::new();
    let tls_port = free_port(false);
    let _server = RedisServer::start_with_args(&pki.server_args(tls_port, false));
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    runtime().block_on(async {
        let err = CellStore::connect(builder().tls_root_cert(pki.read("ca.crt")), url.as_str())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("redis-cell"), "{err}");
        let err = CellStore::connect(builder(), url.as_str())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Connection(_)), "{err:?}");
        // CellStore's own builder takes the same path. Its timeout is far
        // beyond a handshake's time on any machine, however loaded: the
        // refusal of the untrusted certificate is what is tested, never a
        // race with the clock (at the default 200 ms a busy machine timed
        // out first).
        let patient = || CellStore::builder().timeout(Duration::from_secs(30));
        let err = patient()
            .tls_root_cert(pki.read("ca.crt"))
            .connect(url.as_str())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("redis-cell"), "{err}");
        let err = patient().connect(url.as_str()).await.unwrap_err();
        assert!(matches!(err, StoreError::Connection(_)), "{err:?}");
    });
}

/// A three-master cluster speaking TLS to clients and on its bus
/// (`--tls-cluster yes`): the cluster store discovers the nodes' TLS ports
/// and verifies each against the test CA.
#[test]
fn rediss_cluster() {
    let pki = Pki::new();
    let (nodes, tls_ports) = start_tls_nodes(&pki);
    let addrs: Vec<String> = tls_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    create_tls_cluster(&pki, &addrs, &nodes);
    let urls: Vec<String> = addrs.iter().map(|a| format!("rediss://{a}/")).collect();
    runtime().block_on(async {
        let store = builder()
            .tls_root_cert(pki.read("ca.crt"))
            .connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap();
        // Keys spread over the three masters: every one decided over TLS.
        let p = policy();
        for k in 0..30u32 {
            let key = format!("user-{k}");
            for _ in 0..5 {
                let d = store
                    .check(tower_throttle::store::Charge::new(key.as_bytes(), &p, 1))
                    .await
                    .unwrap();
                assert!(d.allowed, "{key}");
            }
            let d = store
                .check(tower_throttle::store::Charge::new(key.as_bytes(), &p, 1))
                .await
                .unwrap();
            assert!(!d.allowed, "{key}");
        }
        let keys_on =
            |n: &RedisServer| -> u64 { redis::cmd("DBSIZE").query(&mut n.conn()).unwrap() };
        assert!(nodes.iter().all(|n| keys_on(n) > 0), "keys on every master");
        let err = builder()
            .connect_cluster(urls.iter().map(String::as_str))
            .await
            .unwrap_err();
        println!("TLS cluster without the CA: {err}");
    });
}

/// Three cluster nodes that talk TLS to clients, on the bus and to replicas;
/// the nodes and their TLS ports.
fn start_tls_nodes(pki: &Pki) -> (Vec<RedisServer>, Vec<u16>) {
    let mut nodes = Vec::new();
    let mut tls_ports = Vec::new();
    for i in 0..3 {
        // Nodes meet on their TLS port + 10000: the bus listens there.
        let (port, tls_port) = (free_port(false), free_port(true));
        let mut args = pki.server_args(tls_port, false);
        let bus = (tls_port + 10_000).to_string();
        args.extend(
            [
                "--cluster-port",
                &bus,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &pki.path(&format!("nodes-{i}.conf")),
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ]
            .map(String::from),
        );
        nodes.push(RedisServer::start_on(port, &args));
        tls_ports.push(tls_port);
    }
    (nodes, tls_ports)
}

/// Joins the nodes at `addrs` into one cluster and waits until every node
/// reports `cluster_state:ok`, within 30 s in all.
fn create_tls_cluster(pki: &Pki, addrs: &[String], nodes: &[RedisServer]) {
    // `--cluster create` waits for the nodes to join: bounded here, since a
    // bus that cannot handshake would make it wait forever.
    let mut create = Command::new("redis-cli")
        .args([
            "--tls",
            "--cacert",
            &pki.path("ca.crt"),
            "--cluster",
            "create",
        ])
        .args(addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-cli");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = create.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = create.kill();
            panic!("redis-cli --cluster create over TLS did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "redis-cli --cluster create: {status}");
    while !nodes.iter().all(|n| {
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query::<String>(&mut n.conn())
            .is_ok_and(|s| s.contains("cluster_state:ok"))
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "TLS cluster not ok in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
