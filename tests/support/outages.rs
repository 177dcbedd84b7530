//! Real `redis-server`s put into the states in which they answer but cannot
//! decide: out of memory, busy with another client's script, loading,
//! a replica, a replica without its master; and a connection that flushes
//! the script cache before each script call, or runs another script. Each state is entered and left
//! by commands, and each wait for the server to be in it polls a third
//! connection with a generous deadline: a slow machine makes the test
//! slower, never wrong.
//!
//! Include after `support/redis.rs`:
//! `#[path = "support/outages.rs"] mod outages;` (it names `crate::redis_support`).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Arg, Cmd, Pipeline, RedisFuture, Value};
use tower_throttle::store::redis::RedisStore;

use crate::redis_support::{free_port, RedisServer};

/// The most any wait below takes before it fails the test.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `ready` every 10 ms until it holds; panics naming `what` after
/// [`DEADLINE`].
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The error code of the server's reply to `PING` on a new connection
/// (`None` for `PONG`).
pub fn ping_code(server: &RedisServer) -> Option<String> {
    match redis::cmd("PING").query::<String>(&mut server.conn()) {
        Ok(_) => None,
        Err(e) => Some(e.code().unwrap_or("?").to_owned()),
    }
}

/// Waits until the server answers `PING` with `code`.
pub fn wait_for_ping(server: &RedisServer, code: Option<&str>) {
    wait_until(&format!("PING answering {code:?}"), || {
        ping_code(server).as_deref() == code
    });
}

/// `--maxmemory 2mb --maxmemory-policy noeviction`: the README's advice,
/// with a small limit.
pub fn small_noeviction() -> Vec<String> {
    ["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]
        .map(String::from)
        .to_vec()
}

/// Junk keys (no TTL: never evicted) of `size` bytes, `n` per call.
fn junk(conn: &mut redis::Connection, tag: &str, n: u32, size: u32) -> redis::RedisResult<i64> {
    redis::cmd("EVAL")
        .arg(
            "for i = 1, ARGV[2] do redis.call('SET', ARGV[1] .. i, string.rep('x', ARGV[3])) end \
             return 1",
        )
        .arg(0)
        .arg(tag)
        .arg(n)
        .arg(size)
        .query(conn)
}

/// Writes junk keys until the server refuses writes with `OOM`, then 1 MB
/// more with `maxmemory` lifted for that write, so that memory freed
/// meanwhile (a client's buffers) cannot bring it back under the limit.
pub fn fill_until_oom(server: &RedisServer) {
    let mut conn = server.conn();
    let mut round = 0;
    loop {
        match junk(&mut conn, &format!("junk:{round}:"), 200, 200) {
            Ok(_) => round += 1,
            Err(e) if e.code() == Some("OOM") => break,
            Err(e) => panic!("filling the server: {e}"),
        }
        assert!(round < 10_000, "the server never ran out of memory");
    }
    let limit: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query(&mut conn)
        .unwrap();
    config_set(server, "maxmemory", "0");
    junk(&mut conn, "junk:over:", 1000, 1000).expect("the write past the limit");
    config_set(server, "maxmemory", &limit[1]);
    let refused = redis::cmd("SET")
        .arg("probe")
        .arg("x")
        .query::<()>(&mut server.conn());
    assert_eq!(
        refused.unwrap_err().code(),
        Some("OOM"),
        "the server refuses writes"
    );
}

/// Another client's script looping until `SCRIPT KILL`, on a server started
/// with [`busy_threshold`]: meanwhile the server answers `BUSY`.
/// If the test fails first, killing the server ends the script's client.
pub struct BusyScript {
    thread: JoinHandle<()>,
}

/// `--busy-reply-threshold 50` (Redis 7; `lua-time-limit` before): the
/// server answers `BUSY` once a script has run 50 ms.
pub fn busy_threshold() -> Vec<String> {
    ["--busy-reply-threshold", "50"].map(String::from).to_vec()
}

impl BusyScript {
    /// Starts the script and waits until a `PING` is answered `BUSY`.
    pub fn start(server: &RedisServer) -> BusyScript {
        let mut conn = server.conn();
        let thread = std::thread::spawn(move || {
            // Ends with an error once killed: that is its only way out.
            let _ = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<redis::Value>(&mut conn);
        });
        wait_for_ping(server, Some("BUSY"));
        BusyScript { thread }
    }

    /// Kills the script (`SCRIPT KILL`) and waits for its client.
    pub fn stop(self, server: &RedisServer) {
        let _: () = redis::cmd("SCRIPT")
            .arg("KILL")
            .query(&mut server.conn())
            .expect("SCRIPT KILL");
        self.thread.join().expect("the busy script's thread");
        wait_for_ping(server, None);
    }
}

/// `--enable-debug-command local`, for `DEBUG RELOAD`.
pub fn debug_enabled() -> Vec<String> {
    ["--enable-debug-command", "local"]
        .map(String::from)
        .to_vec()
}

/// A server reloading its data set (`DEBUG RELOAD`) slowly: 5,000 keys of
/// 2 KB, `key-load-delay` 10 ms each (50 s at most), with events served
/// between keys (`loading-process-events-interval-bytes` 1024), so
/// meanwhile it answers `LOADING` within about 10 ms.
pub struct Loading {
    thread: JoinHandle<()>,
}

impl Loading {
    /// Fills the server, starts the reload and waits until a `PING` is
    /// answered `LOADING`.
    pub fn start(server: &RedisServer) -> Loading {
        let mut conn = server.conn();
        let _: i64 = redis::cmd("EVAL")
            .arg(
                "for i = 1, 5000 do redis.call('SET', 'data:' .. i, string.rep('x', 2048)) end \
                 return 1",
            )
            .arg(0)
            .query(&mut conn)
            .expect("writing the data set");
        config_set(server, "loading-process-events-interval-bytes", "1024");
        config_set(server, "key-load-delay", "10000");
        let thread = std::thread::spawn(move || {
            redis::cmd("DEBUG")
                .arg("RELOAD")
                .query::<()>(&mut conn)
                .expect("DEBUG RELOAD");
        });
        wait_for_ping(server, Some("LOADING"));
        Loading { thread }
    }

    /// Lets the load finish at full speed and waits for it.
    pub fn finish(self, server: &RedisServer) {
        config_set(server, "key-load-delay", "0");
        self.thread.join().expect("DEBUG RELOAD's thread");
        wait_for_ping(server, None);
    }
}

/// `CONFIG SET name value` (allowed while loading).
pub fn config_set(server: &RedisServer, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut server.conn())
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// `REPLICAOF host port`, or `REPLICAOF NO ONE` for `None`.
pub fn replica_of(server: &RedisServer, master: Option<u16>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match master {
        Some(port) => cmd.arg("127.0.0.1").arg(port),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: () = cmd.query(&mut server.conn()).expect("REPLICAOF");
}

/// Waits until the replica `server` has synced with its master (before,
/// it may answer `LOADING` while it loads the master's data).
pub fn wait_link_up(server: &RedisServer) {
    wait_until("master_link_status:up", || {
        redis::cmd("INFO")
            .arg("replication")
            .query::<String>(&mut server.conn())
            .is_ok_and(|i| i.contains("master_link_status:up"))
    });
}

/// Makes `server` a replica of a port nobody listens on, with
/// `replica-serve-stale-data no`: it answers `MASTERDOWN`.
pub fn lose_master(server: &RedisServer) {
    config_set(server, "replica-serve-stale-data", "no");
    replica_of(server, Some(free_port(false)));
    wait_for_ping(server, Some("MASTERDOWN"));
}

/// A connection to a real server that changes what the store's `EVALSHA`s
/// meet: a script cache flushed before each one, or another script run in
/// their place.
#[derive(Clone)]
pub struct Meddling {
    inner: ConnectionManager,
    /// `None`: `SCRIPT FLUSH` first. `Some(lua)`: `EVAL lua 0` instead.
    instead: Option<&'static str>,
    pub flushes: Arc<Mutex<u32>>,
}

impl ConnectionLike for Meddling {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let first = cmd.args_iter().next();
            if !matches!(first, Some(Arg::Simple(c)) if c.eq_ignore_ascii_case(b"EVALSHA")) {
                return self.inner.req_packed_command(cmd).await;
            }
            let mut other = Cmd::new();
            match self.instead {
                None => {
                    other.arg("SCRIPT").arg("FLUSH");
                    self.inner.req_packed_command(&other).await?;
                    *self.flushes.lock().unwrap() += 1;
                    self.inner.req_packed_command(cmd).await
                }
                Some(lua) => {
                    other.arg("EVAL").arg(lua).arg(0);
                    self.inner.req_packed_command(&other).await
                }
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// A store on `server` through a [`Meddling`] connection (built, not
/// connected: no connect-time checks).
pub async fn meddled(
    server: &RedisServer,
    instead: Option<&'static str>,
    timeout: Duration,
) -> RedisStore<Meddling> {
    let client = redis::Client::open(server.url()).unwrap();
    let inner = ConnectionManager::new(client).await.unwrap();
    let conn = Meddling {
        inner,
        instead,
        flushes: Arc::default(),
    };
    RedisStore::builder()
        .timeout(timeout)
        .build(conn, false)
        .unwrap()
}

/// `--enable-protected-configs local`, for `CONFIG SET dir` (see
/// [`FailingSaves`]).
pub fn dir_settable() -> Vec<String> {
    ["--enable-protected-configs", "local"]
        .map(String::from)
        .to_vec()
}

/// One field of `INFO <section>` (`name:value`), trimmed.
pub fn info_field(server: &RedisServer, section: &str, name: &str) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(&mut server.conn())
        .ok()?;
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_owned())
}

/// A server whose RDB saves fail, on a server started with
/// [`dir_settable`]: it saves (`save 3600 1`, so
/// `stop-writes-on-bgsave-error yes`, the default, applies) into a
/// directory that is then removed, and a `BGSAVE` fails for want of it
/// (root writes anywhere, but not into a directory that is gone).
/// Meanwhile the server answers writes and `PING` with `MISCONF`.
pub struct FailingSaves {
    dir: std::path::PathBuf,
}

impl FailingSaves {
    /// Makes the next save fail, runs one, and waits until `INFO
    /// persistence` says it failed.
    pub fn start(server: &RedisServer) -> FailingSaves {
        let base: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("dir")
            .query(&mut server.conn())
            .expect("CONFIG GET dir");
        let dir = std::path::Path::new(&base[1]).join("rdb");
        std::fs::create_dir_all(&dir).unwrap();
        config_set(server, "dir", dir.to_str().unwrap());
        config_set(server, "save", "3600 1");
        std::fs::remove_dir_all(&dir).unwrap();
        bgsave(server, "err");
        FailingSaves { dir }
    }

    /// Gives the server its directory back (a new one at the same path),
    /// saves, and waits until the save succeeded: writes are taken again.
    pub fn fix(self, server: &RedisServer) {
        std::fs::create_dir_all(&self.dir).unwrap();
        config_set(server, "dir", self.dir.to_str().unwrap());
        bgsave(server, "ok");
    }
}

/// Runs a `BGSAVE` and waits until it is over with `status` (`ok`, `err`).
fn bgsave(server: &RedisServer, status: &str) {
    let _: String = redis::cmd("BGSAVE")
        .query(&mut server.conn())
        .expect("BGSAVE");
    wait_until(&format!("rdb_last_bgsave_status:{status}"), || {
        info_field(server, "persistence", "rdb_bgsave_in_progress").as_deref() == Some("0")
            && info_field(server, "persistence", "rdb_last_bgsave_status").as_deref()
                == Some(status)
    });
}

/// `rejected_calls` of `command` in `INFO commandstats`.
pub fn rejected_calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")));
    line.and_then(|l| l.split(',').find_map(|f| f.strip_prefix("rejected_calls=")))
        .map_or(0, |n| n.trim().parse().unwrap())
}
