//! Fault injection for the private Redis servers of `support/redis.rs`:
//! pause a server with SIGSTOP (calls hang, the TCP connection stays up),
//! resume it with SIGCONT, and read `INFO commandstats` to see what the
//! server actually executed.
//!
//! Include after `support/redis.rs`:
//! `#[path = "support/faults.rs"] mod faults;` (it names `crate::redis_support`).
#![allow(dead_code)]

use std::collections::HashMap;
use std::process::Command;

use crate::redis_support::RedisServer;

/// The server's process id, from `INFO server` (it must be answering).
pub fn pid(server: &RedisServer) -> u32 {
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.conn())
        .expect("INFO server");
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("process_id in INFO server")
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid} failed");
}

/// A server stopped with SIGSTOP; SIGCONT on [`Paused::resume`] or on drop
/// (so a failing test never leaves a frozen server behind).
pub struct Paused {
    pid: Option<u32>,
}

impl Paused {
    /// Freezes `server`: its socket still accepts bytes, nothing answers.
    pub fn pause(server: &RedisServer) -> Paused {
        let pid = pid(server);
        signal(pid, "-STOP");
        Paused { pid: Some(pid) }
    }

    /// Lets the server run again.
    pub fn resume(mut self) {
        if let Some(pid) = self.pid.take() {
            signal(pid, "-CONT");
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
    }
}

/// `calls` per command from `INFO commandstats` (`evalsha`, `eval`, `ping`…).
pub fn command_calls(server: &RedisServer) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Scripts the server ran (`EVALSHA` + `EVAL`): one per store call.
pub fn script_calls(server: &RedisServer) -> u64 {
    let calls = command_calls(server);
    calls.get("evalsha").copied().unwrap_or(0) + calls.get("eval").copied().unwrap_or(0)
}

/// The port of the master serving `slot`, from `CLUSTER SLOTS`.
pub fn master_port_of_slot(server: &RedisServer, slot: u16) -> u16 {
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut server.conn())
        .expect("CLUSTER SLOTS");
    for range in slots {
        let redis::Value::Array(items) = range else {
            continue;
        };
        let (Some(redis::Value::Int(lo)), Some(redis::Value::Int(hi))) =
            (items.first(), items.get(1))
        else {
            continue;
        };
        if (*lo..=*hi).contains(&i64::from(slot)) {
            if let Some(redis::Value::Array(master)) = items.get(2) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return u16::try_from(*port).expect("port");
                }
            }
        }
    }
    panic!("slot {slot} is not served")
}

/// `CLUSTER KEYSLOT key`.
pub fn keyslot(server: &RedisServer, key: &[u8]) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut server.conn())
        .expect("CLUSTER KEYSLOT")
}
