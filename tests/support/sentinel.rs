//! A Redis Sentinel for tests, on a port chosen in advance: the server
//! binary of `support/redis.rs` in sentinel mode (`--sentinel`, so Valkey
//! runs its own), monitoring a master by name, which need not be up yet;
//! killed (with its temp dir removed) on drop.
//!
//! Include after `support/redis.rs`:
//! `#[path = "../support/sentinel.rs"] mod sentinel;` (it names
//! `crate::redis_support`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis_support::server_binary;

/// One sentinel process.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Sentinel {
    /// Starts a sentinel on `port` (from `free_port`) monitoring the master
    /// `name` at `127.0.0.1:<master_port>` with a quorum of 1 (it alone
    /// decides the master is down, after 1 s), and waits (≤ 10 s) until it
    /// answers `PING`.
    pub fn start_on(port: u16, name: &str, master_port: u16) -> Sentinel {
        let dir = std::env::temp_dir().join(format!(
            "tower-throttle-sentinel-{}-{port}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n",
                dir = dir.display(),
            ),
        )
        .unwrap();
        let binary = server_binary();
        let child = Command::new(&binary)
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary} --sentinel: {e}"));
        let mut sentinel = Sentinel { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while sentinel.conn().is_none() {
            if let Ok(Some(status)) = sentinel.child.try_wait() {
                panic!("the sentinel on port {port} exited: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the sentinel on port {port} did not answer within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A connection that answered `PING`, if the sentinel takes one.
    pub fn conn(&self) -> Option<redis::Connection> {
        let mut conn = redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        redis::cmd("PING").query::<String>(&mut conn).ok()?;
        Some(conn)
    }

    /// The flags this sentinel gives the master `name` (`master`,
    /// `s_down,master`, ...), if it answers.
    pub fn master_flags(&self, name: &str) -> Option<String> {
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query(&mut self.conn()?)
            .ok()?;
        fields
            .chunks(2)
            .find(|kv| kv[0] == "flags")
            .map(|kv| kv[1].clone())
    }

    /// The connections the sentinel has accepted (`INFO stats`'
    /// `total_connections_received`).
    pub fn connections(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut self.conn().expect("the sentinel answers"))
            .expect("INFO stats");
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
