//! The processes compared: a `redis-server`, throttle-rls,
//! envoyproxy/ratelimit and limitador-server, each started here on free
//! loopback ports with its configuration in a scratch directory, and
//! killed when dropped.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a process may take to answer after it is spawned.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A port free on loopback now (the bind is dropped, so another process
/// may take it before ours does: the start then fails with the log).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// A directory under the system temp dir, removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rls-peers-{}-{tag}-{n}", std::process::id()));
        std::fs::create_dir_all(dir.join("config")).expect("scratch dir");
        Scratch(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("scratch file");
        path
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.0.join("log")).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn(cmd: &mut Command, dir: &Scratch) -> Result<Child, String> {
    let log = File::create(dir.0.join("log")).map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))
}

/// A `redis-server` of its own, nothing saved to disk.
pub struct Redis {
    child: Child,
    /// Its loopback port.
    pub port: u16,
    _dir: Scratch,
}

impl Redis {
    /// Starts one and waits for its `PONG`.
    pub fn start() -> Result<Redis, String> {
        let dir = Scratch::new("redis");
        let port = free_port();
        let child = spawn(
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .current_dir(&dir.0),
            &dir,
        )?;
        let mut redis = Redis {
            child,
            port,
            _dir: dir,
        };
        let end = Instant::now() + START_DEADLINE;
        while Instant::now() < end {
            if let Ok(Some(status)) = redis.child.try_wait() {
                return Err(format!(
                    "redis-server exited ({status}): {}",
                    redis._dir.log()
                ));
            }
            if redis.ping() {
                return Ok(redis);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("redis-server did not answer PING".into())
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut buf = [0u8; 7];
        s.set_read_timeout(Some(Duration::from_secs(2))).is_ok()
            && s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut buf).is_ok()
            && &buf == b"+PONG\r\n"
    }

    /// `host:port`, as upstream's and throttle-rls' `REDIS_URL` take it.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Which server.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Ours,
    Upstream,
    Limitador,
}

impl Kind {
    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ours => "throttle-rls",
            Kind::Upstream => "envoyproxy/ratelimit",
            Kind::Limitador => "limitador",
        }
    }
}

/// The binaries found: throttle-rls always, each peer when its variable is set.
pub struct Bins {
    ours: PathBuf,
    upstream: Option<PathBuf>,
    limitador: Option<PathBuf>,
}

impl Bins {
    /// `RLS_BIN` (default: `throttle-rls` in the profile directory this
    /// example runs from), `RLS_PEER_UPSTREAM`, `RLS_PEER_LIMITADOR`.
    pub fn from_env() -> Result<Bins, String> {
        let ours = match std::env::var_os("RLS_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| e.to_string())?
                .parent()
                .and_then(Path::parent)
                .ok_or("no profile directory")?
                .join("throttle-rls"),
        };
        if !ours.is_file() {
            return Err(format!(
                "{} not found: build it first (cargo build --release -p tower-throttle-rls \
                 --bin throttle-rls) or set RLS_BIN",
                ours.display()
            ));
        }
        let peer = |var: &str, what: &str| match std::env::var_os(var) {
            Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
            _ => {
                println!("{var} is unset: {what} skipped");
                None
            }
        };
        Ok(Bins {
            ours,
            upstream: peer("RLS_PEER_UPSTREAM", "envoyproxy/ratelimit"),
            limitador: peer("RLS_PEER_LIMITADOR", "limitador-server"),
        })
    }

    /// The binary of `kind`, if there is one.
    pub fn get(&self, kind: Kind) -> Option<&Path> {
        match kind {
            Kind::Ours => Some(&self.ours),
            Kind::Upstream => self.upstream.as_deref(),
            Kind::Limitador => self.limitador.as_deref(),
        }
    }
}

/// Where a server keeps its counters.
#[derive(Clone, Copy)]
pub enum Store<'a> {
    Memory,
    Redis(&'a Redis),
}

/// One limit on descriptor key `user` of domain `bench`, each value its
/// own counter, written in each server's own terms.
pub struct Limit {
    pub per: u32,
    /// `minute` or `hour`.
    pub unit: &'static str,
}

impl Limit {
    /// Upstream's YAML, which throttle-rls reads as it is.
    pub fn upstream_yaml(&self) -> String {
        format!(
            "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: {}\n      requests_per_unit: {}\n",
            self.unit, self.per
        )
    }

    /// limitador's: namespace = domain, one counter per value of the first
    /// descriptor's `user` entry (a descriptor without it is not limited).
    fn limitador_yaml(&self) -> String {
        let seconds = if self.unit == "hour" { 3600 } else { 60 };
        format!(
            "- namespace: bench\n  max_value: {}\n  seconds: {seconds}\n  conditions: []\n  variables:\n    - descriptors[0].user\n",
            self.per
        )
    }
}

/// A server process on loopback.
pub struct Server {
    pub kind: Kind,
    /// Its gRPC address.
    pub addr: SocketAddr,
    child: Child,
    dir: Scratch,
}

impl Server {
    /// `kind` with `limit` on `store`; `env` adds to (or overrides) the
    /// environment of throttle-rls and upstream.
    pub async fn start(
        bins: &Bins,
        kind: Kind,
        store: Store<'_>,
        limit: &Limit,
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        match kind {
            Kind::Limitador => Server::limitador(bins, store, limit).await,
            _ => Server::upstream_like(bins, kind, store, &limit.upstream_yaml(), env).await,
        }
    }

    /// throttle-rls or upstream, with the environment upstream documents.
    pub async fn upstream_like(
        bins: &Bins,
        kind: Kind,
        store: Store<'_>,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        let bin = bins.get(kind).ok_or("no binary")?;
        let dir = Scratch::new("rls");
        dir.write("config/bench.yaml", yaml);
        let grpc = free_port();
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .env("RUNTIME_ROOT", &dir.0)
            .env("RUNTIME_SUBDIRECTORY", "")
            .env("RUNTIME_WATCH_ROOT", "false")
            .env("RUNTIME_IGNOREDOTFILES", "true")
            .env("USE_STATSD", "false")
            .env("LOG_LEVEL", "warn")
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc.to_string())
            .env("HOST", "127.0.0.1")
            .env("PORT", free_port().to_string())
            .env("DEBUG_HOST", "127.0.0.1")
            .env("DEBUG_PORT", free_port().to_string());
        match store {
            Store::Redis(r) => cmd
                .env("BACKEND_TYPE", "redis")
                .env("REDIS_SOCKET_TYPE", "tcp")
                .env("REDIS_URL", r.addr()),
            Store::Memory => cmd.env("BACKEND_TYPE", "memory"),
        };
        cmd.envs(env.iter().copied());
        let child = spawn(&mut cmd, &dir)?;
        Server::ready(kind, grpc, child, dir).await
    }

    async fn limitador(bins: &Bins, store: Store<'_>, limit: &Limit) -> Result<Server, String> {
        let bin = bins.get(Kind::Limitador).ok_or("no binary")?;
        let dir = Scratch::new("limitador");
        let limits = dir.write("limits.yaml", &limit.limitador_yaml());
        let grpc = free_port();
        let mut cmd = Command::new(bin);
        cmd.args(["--rls-ip", "127.0.0.1", "--rls-port", &grpc.to_string()])
            .args([
                "--http-ip",
                "127.0.0.1",
                "--http-port",
                &free_port().to_string(),
            ])
            .arg(&limits);
        match store {
            Store::Redis(r) => cmd.args(["redis", &format!("redis://{}/", r.addr())]),
            // Its default keeps 1,000 counters; the many-key runs use 10,000.
            Store::Memory => cmd.args(["memory", "--cache", "1000000"]),
        };
        let child = spawn(&mut cmd, &dir)?;
        Server::ready(Kind::Limitador, grpc, child, dir).await
    }

    async fn ready(
        kind: Kind,
        port: u16,
        mut child: Child,
        dir: Scratch,
    ) -> Result<Server, String> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let end = Instant::now() + START_DEADLINE;
        while Instant::now() < end {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("{} exited ({status}): {}", kind.name(), dir.log()));
            }
            if crate::load::probe(addr).await {
                return Ok(Server {
                    kind,
                    addr,
                    child,
                    dir,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        Err(format!(
            "{} did not answer on {addr}: {}",
            kind.name(),
            dir.log()
        ))
    }

    /// What it wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        self.dir.log()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
