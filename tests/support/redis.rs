//! Private Redis servers for tests: a single server and a 3-master cluster,
//! started from `redis-server` on PATH (or the server named by
//! `TOWER_THROTTLE_REDIS_SERVER`, e.g. a `valkey-server`) on free loopback
//! ports, without persistence, and killed (with their temp dirs removed) on
//! drop.
//!
//! Include with `#[path = "support/redis.rs"] mod redis_support;`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const INSTALL: &str = "not found: install redis-server (Debian/Ubuntu: \
    `sudo apt-get install redis-server`; macOS: `brew install redis`), or set \
    TOWER_THROTTLE_REDIS_SERVER to the path of a valkey-server";

/// The server binary: `TOWER_THROTTLE_REDIS_SERVER` (a path or a name on
/// PATH, e.g. `valkey-server`), `redis-server` when unset.
pub fn server_binary() -> String {
    std::env::var("TOWER_THROTTLE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tower-throttle-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A free loopback port (and, for cluster nodes, its bus port + 10000).
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

fn admin_url(port: u16, password: Option<&str>) -> String {
    match password {
        Some(pw) => format!("redis://:{pw}@127.0.0.1:{port}/"),
        None => format!("redis://127.0.0.1:{port}/"),
    }
}

fn ping(port: u16, password: Option<&str>) -> bool {
    let Ok(client) = redis::Client::open(admin_url(port, password)) else {
        return false;
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
        return false;
    };
    redis::cmd("PING").query::<String>(&mut con).is_ok()
}

/// One `redis-server` process.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// The default user's password (`--requirepass`), if any.
    password: Option<String>,
}

impl RedisServer {
    /// Starts a standalone server and waits (≤ 10 s) until it answers PING.
    pub fn start() -> RedisServer {
        Self::start_on_a_free_port(temp_dir("redis"), Vec::new(), None)
    }

    /// Starts a standalone server with extra `redis-server` arguments (for
    /// example `--loadmodule <path>`).
    pub fn start_with_args(args: &[String]) -> RedisServer {
        Self::start_on_a_free_port(temp_dir("redis"), args.to_vec(), None)
    }

    /// Starts a server on `port` (from [`free_port`]) with extra arguments.
    pub fn start_on(port: u16, args: &[String]) -> RedisServer {
        Self::start_with(port, temp_dir("redis"), args.to_vec())
    }

    /// Starts a standalone server whose default user needs `password`
    /// (`--requirepass`), with extra arguments. [`RedisServer::url`] stays
    /// without credentials; [`RedisServer::conn`] and the harness use them.
    pub fn start_with_password(password: &str, args: &[String]) -> RedisServer {
        let mut extra = vec!["--requirepass".to_owned(), password.to_owned()];
        extra.extend_from_slice(args);
        Self::start_on_a_free_port(temp_dir("redis"), extra, Some(password.to_owned()))
    }

    /// Starts on a free port, trying another when the server exits at once:
    /// the port found free may be taken before the server binds it (another
    /// test's server, or a client's outgoing connection).
    fn start_on_a_free_port(
        dir: PathBuf,
        extra: Vec<String>,
        password: Option<String>,
    ) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port: free_port(false),
            dir,
            extra,
            password,
        };
        for _ in 0..4 {
            match server.try_spawn() {
                Ok(()) => return server,
                Err(_) => server.port = free_port(false),
            }
        }
        server.spawn();
        server
    }

    fn start_with(port: u16, dir: PathBuf, extra: Vec<String>) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra,
            password: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        if let Err(e) = self.try_spawn() {
            panic!("{e}");
        }
    }

    /// Starts the server; errs when it exits before answering PING.
    fn try_spawn(&mut self) -> Result<(), String> {
        let binary = server_binary();
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("{binary}: {INSTALL}")
            }
            Err(e) => panic!("cannot start {binary}: {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.port, self.password.as_deref()) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!(
                    "redis-server on port {} exited: {status}",
                    self.port
                ));
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (state lost: no persistence).
    pub fn stop(&mut self) {
        self.kill();
    }

    /// Starts it again on the same port.
    pub fn start_again(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server and starts it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Kills the server and starts it again on the same port with the
    /// default user's password `password` (`--requirepass`), or with none:
    /// a restart that changed the server's credentials.
    pub fn restart_with_password(&mut self, password: Option<&str>) {
        self.kill();
        if let Some(i) = self.extra.iter().position(|a| a == "--requirepass") {
            self.extra.drain(i..i + 2);
        }
        if let Some(pw) = password {
            self.extra
                .splice(0..0, ["--requirepass".to_owned(), pw.to_owned()]);
        }
        self.password = password.map(str::to_owned);
        self.spawn();
    }

    /// `redis://user:password@127.0.0.1:<port>/`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    /// Creates or replaces an ACL user (`ACL SETUSER <name> reset <rules>`)
    /// through the default user.
    pub fn acl_user(&self, name: &str, rules: &[&str]) {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(name).arg("reset").arg(rules);
        let _: () = cmd.query(&mut self.conn()).expect("ACL SETUSER");
    }

    /// A plain synchronous connection as the default user (with its
    /// password, if any), for inspecting keys.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(admin_url(self.port, self.password.as_deref()))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cluster of three masters, no replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three `--cluster-enabled` servers, joins them with
    /// `redis-cli --cluster create`, and waits (≤ 30 s) for `cluster_state:ok`.
    pub fn start() -> RedisCluster {
        let dir = temp_dir("cluster");
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(Self::node(free_port(true), &dir));
        }
        Self::form(nodes, dir)
    }

    /// [`start`](Self::start) on `ports` chosen in advance (each from
    /// [`free_port`]`(true)`, its bus port + 10000 free too): one master
    /// on each.
    pub fn start_on(ports: &[u16]) -> RedisCluster {
        let dir = temp_dir("cluster");
        let nodes = ports.iter().map(|p| Self::node(*p, &dir)).collect();
        Self::form(nodes, dir)
    }

    /// A `--cluster-enabled` server on `port`, its files under `dir`.
    fn node(port: u16, dir: &std::path::Path) -> RedisServer {
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        let extra = vec![
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            node_dir.join("nodes.conf").display().to_string(),
            "--cluster-node-timeout".into(),
            "5000".into(),
        ];
        RedisServer::start_with(port, node_dir, extra)
    }

    /// Joins `nodes` into a cluster and waits for `cluster_state:ok`.
    fn form(nodes: Vec<RedisServer>, dir: PathBuf) -> RedisCluster {
        let cluster = RedisCluster { nodes, dir };
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli not found: install redis-server (it ships redis-cli)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.nodes.iter().all(|n| {
            redis::cmd("CLUSTER")
                .arg("INFO")
                .query::<String>(&mut n.conn())
                .is_ok_and(|s| s.contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < deadline, "cluster not ok within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// `redis://127.0.0.1:<port>/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A current-thread runtime: deterministic scheduling for one store.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A two-worker runtime for tests that drive several stores at once.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
