//! Every Redis topology upstream's `REDIS_*` settings describe, on real
//! servers: a password, a unix socket, TLS with a private CA, a cluster.

use crate::redis::redis_support::{free_port, RedisServer};
use crate::redis::start_env;
use crate::shared_pki as pki;
use crate::support::*;

/// The same answers whatever the topology.
async fn counts(rls: &mut Rls) {
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OVER, 0)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_auth_password() {
    let redis = RedisServer::start_with_password("s3cr&t", &[]);
    let url = format!("127.0.0.1:{}", redis.port);
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_AUTH", "s3cr&t"),
    ];
    let mut rls = start_env(&env).await;
    counts(&mut rls).await;
    rls.stop().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unix_socket() {
    let dir = Dir::new();
    let socket = dir.0.join("redis.sock");
    let socket = socket.to_str().unwrap();
    let _redis = RedisServer::start_with_args(&[
        "--unixsocket".into(),
        socket.into(),
        "--unixsocketperm".into(),
        "700".into(),
    ]);
    let env = [("REDIS_URL", socket), ("REDIS_SOCKET_TYPE", "unix")];
    let mut rls = start_env(&env).await;
    counts(&mut rls).await;
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tls_with_a_private_ca() {
    let pki = pki::Pki::new();
    let (tls_port, _redis) = crate::redis::tls_server(
        &pki.path("server.crt"),
        &pki.path("server.key"),
        &pki.path("ca.crt"),
        false,
    );
    let url = format!("127.0.0.1:{tls_port}");
    let ca = pki.path("ca.crt");
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", ca.as_str()),
    ];
    let mut rls = start_env(&env).await;
    counts(&mut rls).await;
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_in_both_counting_modes() {
    let (_cluster, nodes) = crate::redis::cluster().await;
    let base = [
        ("REDIS_URL", nodes.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "CLUSTER"),
    ];
    let mut rls = start_env(&base).await;
    counts(&mut rls).await;
    rls.stop().await;
    let mut env = base.to_vec();
    env.push(("RLS_ALL_OR_NOTHING", "true"));
    let mut rls = start_env(&env).await;
    let both = || vec![d(&[("tight", "y")]), d(&[("k", "y")])];
    assert_eq!(codes(&rls.ask("d", both()).await), vec![(OK, 0), (OK, 4)]);
    assert_eq!(codes(&rls.ask("d", both()).await), vec![(OVER, 0), (OK, 4)]);
    rls.stop().await;
}

/// One `redis-sentinel` (quorum 1) watching `master_port` as `themaster`.
struct Sentinel {
    child: std::process::Child,
    port: u16,
    _dir: Dir,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
        let dir = Dir::new();
        let port = free_port(false);
        let conf = dir.0.join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor themaster 127.0.0.1 {master_port} 1\n",
            dir.0.display()
        );
        std::fs::write(&conf, text).unwrap();
        let child = std::process::Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "redis-sentinel not found on PATH (Debian/Ubuntu: apt-get install redis-sentinel)",
            );
        let s = Sentinel {
            child,
            port,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !s.knows_master() {
            assert!(
                std::time::Instant::now() < deadline,
                "sentinel not ready within 30 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        s
    }

    fn knows_master(&self) -> bool {
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)) else {
            return false;
        };
        let Ok(mut c) = client.get_connection_with_timeout(std::time::Duration::from_millis(200))
        else {
            return false;
        };
        let addr: redis::RedisResult<Vec<String>> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("themaster")
            .query(&mut c);
        addr.is_ok_and(|a| a.len() == 2)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel() {
    let master = RedisServer::start();
    let port = master.port;
    let sentinel = tokio::task::spawn_blocking(move || Sentinel::start(port))
        .await
        .unwrap();
    let url = format!("themaster,127.0.0.1:{}", sentinel.port);
    let env = [
        ("REDIS_URL", url.as_str()),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_TYPE", "SENTINEL"),
    ];
    let mut rls = start_env(&env).await;
    counts(&mut rls).await;
    rls.stop().await;
}
