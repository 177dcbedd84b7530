//! Checks run at connect, on every master: credentials, the ACL permissions
//! the scripts need, and the eviction policy. A store that would fail every
//! request, or silently reset quotas, fails to connect (or warns) instead,
//! with a message naming the fix.

use std::future::Future;
use std::sync::LazyLock;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, RedisError, RedisResult, Script, Value};

use super::config::Config;
use super::error::{self, acl_commands, timed, ACL_DOCS};
use super::{RedisStore, TimeSource};
use crate::store::StoreError;

/// Calls every command the scripts make, each with arguments that change
/// nothing (a missing key, an unparsable number: the ACL check comes before
/// the command runs), and reports those refused with the error's text.
/// ARGV: the probe key, then "1" when the scripts read the server's TIME.
const PROBE_LUA: &str = r#"
local k = ARGV[1]
local out = {}
local function try(name, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then out[#out + 1] = name .. '\n' .. r.err end
end
if ARGV[2] == '1' then try('time', 'TIME') end
try('get', 'GET', k)
try('mget', 'MGET', k)
try('set', 'SET', k, '', 'XX')
try('keepttl', 'SET', k, '', 'XX', 'KEEPTTL')
try('incrby', 'INCRBY', k, 'x')
try('pexpire', 'PEXPIRE', k, 1)
try('pttl', 'PTTL', k)
try('del', 'DEL', k)
try('zadd', 'ZADD', k, 'x', '')
try('zrem', 'ZREM', k, '')
try('zrange', 'ZRANGE', k, 0, 0)
try('zrangebyscore', 'ZRANGEBYSCORE', k, 0, 0)
try('zremrangebyscore', 'ZREMRANGEBYSCORE', k, 0, 0)
try('zremrangebyrank', 'ZREMRANGEBYRANK', k, 0, 0)
try('zcard', 'ZCARD', k)
try('zcount', 'ZCOUNT', k, 0, 0)
return out
"#;

static PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(PROBE_LUA));

/// Eviction policies that may evict keys without a TTL, i.e. limiter keys
/// in full use.
const UNSAFE_EVICTION: [&str; 3] = ["allkeys-lru", "allkeys-lfu", "allkeys-random"];

/// What a store's connection needs checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// The scripts of [`RedisStore`]: their commands and keys.
    Scripts,
    /// Credentials and eviction only ([`CellStore`](super::CellStore)).
    Plain,
}

/// What the checks saw.
#[derive(Clone, Debug, Default)]
pub(crate) struct Facts {
    /// `maxmemory-policy` (on a cluster, an unsafe one if any master has
    /// one), or `None` when `CONFIG GET` was refused.
    pub(crate) eviction_policy: Option<String>,
}

/// A connection that can send a command to every master.
pub(crate) trait Nodes: ConnectionLike + Clone + Send + Sync + 'static {
    /// `cmd`'s reply from every master, each with a label naming the node
    /// ("" for a single server).
    fn on_each(
        &mut self,
        cmd: Cmd,
    ) -> impl Future<Output = RedisResult<Vec<(String, RedisResult<Value>)>>> + Send;
}

impl Nodes for ConnectionManager {
    async fn on_each(&mut self, cmd: Cmd) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        Ok(vec![(String::new(), cmd.query_async::<Value>(self).await)])
    }
}

impl Nodes for ClusterConnection {
    async fn on_each(&mut self, cmd: Cmd) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let replies = match self.route_command(cmd, routing).await? {
            Value::Map(pairs) => pairs,
            other => {
                return Ok(vec![(String::new(), Ok(other))]);
            }
        };
        Ok(replies
            .into_iter()
            .map(|(node, reply)| {
                let node = match node {
                    Value::BulkString(b) => format!(" (on {})", String::from_utf8_lossy(&b)),
                    _ => String::new(),
                };
                let reply = match reply {
                    Value::ServerError(e) => Err(RedisError::from(e)),
                    v => Ok(v),
                };
                (node, reply)
            })
            .collect())
    }
}

/// Runs the checks `needs` asks for on every master of `conn`.
pub(crate) async fn run<C: Nodes>(
    conn: &C,
    cfg: &Config,
    needs: Needs,
) -> Result<Facts, StoreError> {
    let t = cfg.timeout;
    let mut conn = conn.clone();
    // Credentials first: everything else would fail on them.
    for (node, reply) in timed(t, conn.on_each(redis::cmd("PING"))).await? {
        reply.map_err(|e| with_node(error::map(e, t), &node))?;
    }
    if needs == Needs::Scripts {
        probe_acl(&mut conn, cfg).await?;
    }
    let mut facts = Facts::default();
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("maxmemory-policy");
    for (node, reply) in timed(t, conn.on_each(get)).await? {
        let policy = match reply {
            Ok(v) => policy_of(&v),
            Err(e) => {
                // CONFIG is an admin command the store does not need: an ACL
                // or a managed service may refuse it.
                tracing::debug!(target: "tower_throttle", error = %e, node = %node,
                    "cannot read the Redis eviction policy; not checked");
                None
            }
        };
        let Some(policy) = policy else { continue };
        if UNSAFE_EVICTION.contains(&policy.as_str()) {
            let why = unsafe_eviction(&policy, &node);
            if cfg.require_safe_eviction {
                return Err(StoreError::Config(why));
            }
            tracing::warn!(target: "tower_throttle", policy = %policy, "{why}");
            facts.eviction_policy = Some(policy);
        } else if facts.eviction_policy.is_none() {
            facts.eviction_policy = Some(policy);
        }
    }
    Ok(facts)
}

fn unsafe_eviction(policy: &str, node: &str) -> String {
    format!(
        "the Redis server{node} evicts with maxmemory-policy {policy}: evicting limiter keys \
         resets their quotas; use noeviction or a volatile-* policy (every key this crate \
         writes has a TTL)"
    )
}

/// Loads and runs the probe script: `SCRIPT LOAD` and `EVALSHA` themselves,
/// then every command and the key pattern the scripts use.
async fn probe_acl<C: Nodes>(conn: &mut C, cfg: &Config) -> Result<(), StoreError> {
    let t = cfg.timeout;
    let mut load = redis::cmd("SCRIPT");
    load.arg("LOAD").arg(PROBE_LUA);
    for (node, reply) in timed(t, conn.on_each(load)).await? {
        reply.map_err(|e| with_node(error::map(e, t), &node))?;
    }
    let key = format!("{}:{{probe}}:preflight", cfg.prefix);
    let server_time = matches!(cfg.time, TimeSource::Server);
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(PROBE.get_hash())
        .arg(0)
        .arg(&key)
        .arg(if server_time { "1" } else { "0" });
    for (node, reply) in timed(t, conn.on_each(eval)).await? {
        let refused = reply.map_err(|e| with_node(error::map(e, t), &node))?;
        let Value::Array(refused) = refused else {
            return Err(StoreError::Protocol(format!(
                "the preflight script replied {refused:?}"
            )));
        };
        let (mut commands, mut key_denied, mut old_server) = (Vec::new(), false, false);
        for item in refused {
            let text = match item {
                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                Value::SimpleString(s) => s,
                _ => continue,
            };
            let (name, why) = text.split_once('\n').unwrap_or((&text, ""));
            match (name, acl_refusal(why)) {
                // `SET`'s own probe reports a refusal of the command.
                ("keepttl", Some(_)) => {}
                ("keepttl", None) => old_server |= keepttl_unknown(why),
                (_, Some(Refusal::Key)) => key_denied = true,
                (_, Some(Refusal::Command)) => commands.push(name.to_owned()),
                // Not an ACL refusal (the probe's invalid arguments, OOM,
                // a cluster's other slots): the command itself is allowed.
                (_, None) => {}
            }
        }
        if old_server {
            return Err(with_node(
                StoreError::Config(
                    "the Redis server does not know `SET … KEEPTTL`: RedisStore needs Redis 6.0                      or later (a fixed-window key keeps its window's expiry with it)"
                        .into(),
                ),
                &node,
            ));
        }
        if !commands.is_empty() {
            return Err(with_node(
                StoreError::Config(acl_commands(&commands)),
                &node,
            ));
        }
        if key_denied {
            return Err(with_node(
                StoreError::Config(format!(
                    "the Redis ACL user may not read and write the keys of prefix `{p}` (probed \
                     `{key}`): add the key pattern `~{p}:*` to its rule, or set the store's \
                     prefix to one its patterns allow; {ACL_DOCS}",
                    p = cfg.prefix,
                )),
                &node,
            ));
        }
    }
    Ok(())
}

/// Whether the error of the `SET … KEEPTTL` probe says the server does not
/// know the option (Redis before 6.0: a syntax error), not that it refused
/// or failed the call.
fn keepttl_unknown(why: &str) -> bool {
    why.to_ascii_lowercase().contains("syntax error")
}

enum Refusal {
    Command,
    Key,
}

/// Whether an error a script got from `redis.pcall` is an ACL refusal, and
/// of what. Redis 6 and 7.0 say "The user executing the script can't run
/// this command" / "can't access at least one of the keys"; 7.2 and later
/// "ACL failure in script: No permissions to run the 'x' command" / "to
/// access a key".
fn acl_refusal(why: &str) -> Option<Refusal> {
    let w = why.to_ascii_lowercase();
    let acl = w.contains("noperm")
        || w.contains("acl failure")
        || w.contains("user executing the script")
        || w.contains("no permissions");
    if !acl {
        return None;
    }
    Some(if w.contains("key") {
        Refusal::Key
    } else {
        Refusal::Command
    })
}

/// `CONFIG GET`'s value (an array `[name, value]` in RESP2, a map in RESP3).
fn policy_of(v: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match v {
        Value::Array(items) => items.get(1).and_then(text),
        Value::Map(pairs) => pairs.first().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// Names the cluster node in a setup error.
fn with_node(e: StoreError, node: &str) -> StoreError {
    match e {
        StoreError::Config(fix) if !node.is_empty() => StoreError::Config(format!("{fix}{node}")),
        e => e,
    }
}

impl<C> RedisStore<C> {
    /// The server's `maxmemory-policy` seen at connect (on a cluster, an
    /// unsafe one if any master has one), or `None` when it could not be
    /// read (`CONFIG GET` refused, or a store made with
    /// [`RedisStoreBuilder::build`](super::RedisStoreBuilder::build)).
    /// `allkeys-*` policies evict limiter keys and so reset quotas.
    pub fn server_eviction_policy(&self) -> Option<&str> {
        self.cfg.eviction_policy.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command a script calls is probed, so a script gaining a
    /// command cannot pass `connect` and then fail every request under the
    /// minimal ACL rule.
    #[test]
    fn the_probe_tries_every_command_the_scripts_call() {
        let mut called = std::collections::BTreeSet::new();
        for source in super::super::registry::lua_sources() {
            for call in [
                "redis.call('",
                "redis.pcall('",
                "call_redis('",
                "pcall_redis('",
            ] {
                for (i, _) in source.match_indices(call) {
                    let rest = &source[i + call.len()..];
                    let name = &rest[..rest.find('\'').unwrap()];
                    called.insert(name.to_ascii_uppercase());
                }
            }
        }
        assert!(called.contains("ZRANGEBYSCORE"), "the scan finds calls");
        for command in &called {
            assert!(
                PROBE_LUA.contains(&format!("'{command}'")),
                "the ACL probe misses {command}"
            );
        }
    }

    #[test]
    fn acl_refusals_across_redis_versions() {
        let cmd = "ERR The user executing the script can't run this command or subcommand";
        let key = "ERR The user executing the script can't access at least one of the keys \
                   mentioned in the command arguments";
        assert!(matches!(acl_refusal(cmd), Some(Refusal::Command)));
        assert!(matches!(acl_refusal(key), Some(Refusal::Key)));
        let cmd72 = "ERR ACL failure in script: No permissions to run the 'time' command";
        let key72 = "ERR ACL failure in script: No permissions to access a key";
        assert!(matches!(acl_refusal(cmd72), Some(Refusal::Command)));
        assert!(matches!(acl_refusal(key72), Some(Refusal::Key)));
        assert!(acl_refusal("ERR value is not an integer or out of range").is_none());
        assert!(acl_refusal("ERR value is not a valid float").is_none());
    }

    /// Redis before 6.0 answers `SET k v XX KEEPTTL` with a syntax error:
    /// that, and only that, fails the connect as a server too old.
    #[test]
    fn keepttl_probe_tells_an_old_server_from_other_errors() {
        assert!(keepttl_unknown("ERR syntax error"));
        assert!(!keepttl_unknown(
            "OOM command not allowed when used memory > 'maxmemory'."
        ));
        assert!(!keepttl_unknown(
            "ERR The user executing the script can't run this command or subcommand"
        ));
    }

    /// Connecting can be spawned: the checks keep the futures `Send`.
    #[test]
    fn connect_futures_are_send() {
        fn send<T: Send>(_: T) {}
        send(RedisStore::builder().connect("redis://127.0.0.1:1/"));
        send(RedisStore::builder().connect_cluster(["redis://127.0.0.1:1/"]));
        send(super::super::CellStore::connect(
            RedisStore::builder(),
            "redis://127.0.0.1:1/",
        ));
    }

    #[test]
    fn eviction_policy_replies() {
        let resp2 = Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"allkeys-lru".to_vec()),
        ]);
        assert_eq!(policy_of(&resp2).as_deref(), Some("allkeys-lru"));
        let resp3 = Value::Map(vec![(
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"noeviction".to_vec()),
        )]);
        assert_eq!(policy_of(&resp3).as_deref(), Some("noeviction"));
        assert_eq!(policy_of(&Value::Array(vec![])), None);
    }
}
