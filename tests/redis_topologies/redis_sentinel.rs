//! Redis Sentinel against real processes: one master, one replica and three
//! `redis-sentinel`s on free loopback ports. The store finds the master by
//! name and follows a `SENTINEL FAILOVER` under load (feature `redis`).

use crate::redis_support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis_support::{free_port, runtime, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisSentinelStore, RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store, StoreError};

const MASTER: &str = "themaster";

struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Sentinel {
    /// A sentinel monitoring the master on `master_port`, authenticating to
    /// it (and its replicas) with `password` if given.
    fn start(master_port: u16, password: Option<&str>) -> Sentinel {
        let port = free_port(false);
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
                 sentinel monitor {MASTER} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n\
                 sentinel parallel-syncs {MASTER} 1\n{auth}",
                dir = dir.display(),
                auth = password
                    .map(|p| format!("sentinel auth-pass {MASTER} {p}\n"))
                    .unwrap_or_default(),
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "redis-sentinel not found on PATH: install it (Debian/Ubuntu: \
                 `sudo apt-get install redis-sentinel`)",
            );
        Sentinel { child, port, dir }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn conn(&self) -> Option<redis::Connection> {
        redis::Client::open(self.url())
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()
    }

    /// Whether this sentinel knows a healthy replica and both other sentinels.
    fn ready(&self) -> bool {
        let Some(mut c) = self.conn() else {
            return false;
        };
        let master: redis::RedisResult<Vec<String>> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER)
            .query(&mut c);
        let field = |v: &[String], name: &str| {
            v.chunks(2)
                .find(|kv| kv[0] == name)
                .map(|kv| kv[1].clone())
                .unwrap_or_default()
        };
        let Ok(m) = master else { return false };
        field(&m, "num-slaves") == "1"
            && field(&m, "num-other-sentinels") == "2"
            && field(&m, "flags") == "master"
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Group {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<Sentinel>,
}

impl Group {
    fn start() -> Group {
        Group::start_with(None)
    }

    /// With `password`, every server requires it (`requirepass`; the replica
    /// uses it as `masterauth`) and the sentinels know it (`auth-pass`).
    fn start_with(password: Option<&str>) -> Group {
        let (master, replica) = match password {
            None => {
                let master = RedisServer::start();
                let replica = RedisServer::start_with_args(&[
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master.port.to_string(),
                ]);
                (master, replica)
            }
            Some(p) => {
                let master = RedisServer::start_with_password(p, &[]);
                let replica = RedisServer::start_with_password(
                    p,
                    &[
                        "--masterauth".into(),
                        p.into(),
                        "--replicaof".into(),
                        "127.0.0.1".into(),
                        master.port.to_string(),
                    ],
                );
                (master, replica)
            }
        };
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::start(master.port, password))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sentinels.iter().all(Sentinel::ready) {
            assert!(Instant::now() < deadline, "sentinels not ready within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Group {
            master,
            replica,
            sentinels,
        }
    }

    fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    fn role(server: &RedisServer) -> String {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.conn())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("role:"))
            .unwrap_or("")
            .trim()
            .to_owned()
    }
}

/// The count of a fixed-window key (`<window>:<count>`, or packed).
fn window_count(server: &RedisServer, key: &[u8]) -> u64 {
    let v: Option<String> = redis::cmd("GET")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    // "<window>:<count>", or packed as window·2^20 + count (fixed_window.lua).
    v.and_then(|v| match v.split_once(':') {
        Some((_, count)) => count.parse().ok(),
        None => v.parse::<u64>().ok().map(|packed| packed % (1 << 20)),
    })
    .unwrap_or(0)
}

async fn connect(group: &Group, time: TimeSource) -> RedisSentinelStore {
    RedisStore::builder()
        .timeout(Duration::from_millis(500))
        .sentinel_poll_interval(Duration::from_millis(100))
        .time_source(time)
        .connect_sentinel(group.urls(), MASTER)
        .await
        .unwrap()
}

/// A master that requires a password is reached with
/// `sentinel_master_auth`; without it, connecting fails (at connect, not on
/// every request).
#[test]
fn a_master_with_a_password_is_reached_with_sentinel_master_auth() {
    let group = Group::start_with(Some("s3cret-pw"));
    runtime().block_on(async {
        // A frozen clock: on the server's a minute boundary mid-test would
        // admit the check asserted denied.
        let store = RedisStore::builder()
            .timeout(Duration::from_millis(500))
            .sentinel_master_auth(None, "s3cret-pw")
            .time_source(TimeSource::client(ManualClock::new()))
            .connect_sentinel(group.urls(), MASTER)
            .await
            .unwrap();
        let p = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
        for _ in 0..2 {
            assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        }
        assert!(!store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        assert_eq!(window_count(&group.master, &store.redis_key(b"k", &p)), 2);
        let err = RedisStore::builder()
            .timeout(Duration::from_millis(500))
            .connect_sentinel(group.urls(), MASTER)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret-pw"), "{err}");
    });
}

#[test]
fn finds_the_master_by_name() {
    let group = Group::start();
    runtime().block_on(async {
        // A frozen clock: on the server's a minute boundary mid-test would
        // admit the check asserted denied.
        let store = connect(&group, TimeSource::client(ManualClock::new())).await;
        let p = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
        for _ in 0..3 {
            assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        }
        assert!(!store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
        // The state is on the master.
        let key = store.redis_key(b"k", &p);
        assert_eq!(window_count(&group.master, &key), 3);
        assert_eq!(store.connection().generation(), 0);
        // The connect-time checks run on the master the sentinels name.
        assert_eq!(store.server_eviction_policy(), Some("noeviction"));
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("allkeys-lru")
            .query(&mut group.master.conn())
            .unwrap();
        let err = RedisStore::builder()
            .require_safe_eviction(true)
            .connect_sentinel(group.urls(), MASTER)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{err:?}");
        assert!(err.to_string().contains("allkeys-lru"), "{err}");
        // A wrong master name is a connect error, not a hang.
        let err = RedisStore::builder()
            .timeout(Duration::from_millis(500))
            .connect_sentinel(group.urls(), "nosuchmaster")
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{err:?}");
        assert!(err.to_string().contains("nosuchmaster"), "{err}");
    });
}

/// Checks under load while `SENTINEL FAILOVER` moves the master: calls
/// fail only during the switch, the store follows the new master, and the
/// count on the new master is short of the admissions by at most those the
/// old master took after the promotion (asynchronous replication).
#[test]
fn follows_a_failover_under_load() {
    let group = Group::start();
    let rt = runtime();
    rt.block_on(async {
        let store = connect(&group, TimeSource::Server).await;
        let count = Policy::fixed_window(1 << 30, Duration::from_secs(3600)).unwrap();
        let cap_limit = 2_000;
        let cap = Policy::fixed_window(cap_limit, Duration::from_secs(3600)).unwrap();
        let start = Instant::now();
        let (mut ok, mut err, mut cap_admitted) = (0u64, 0u64, 0u64);
        let (mut first_err, mut last_err) = (None::<Duration>, None::<Duration>);
        let mut failover_at = None;
        let mut recovered_at = None;
        while start.elapsed() < Duration::from_secs(30) {
            if failover_at.is_none() && start.elapsed() > Duration::from_millis(500) {
                let _: () = redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(MASTER)
                    .query(&mut group.sentinels[0].conn().unwrap())
                    .unwrap();
                failover_at = Some(start.elapsed());
            }
            let a = store.check(Charge::new(b"count", &count, 1)).await;
            let b = store.check(Charge::new(b"cap", &cap, 1)).await;
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    assert!(a.allowed);
                    ok += 1;
                    cap_admitted += u64::from(b.allowed);
                    if recovered_at.is_none() && store.connection().generation() > 0 {
                        recovered_at = Some(start.elapsed());
                    }
                }
                (a, _) => {
                    ok += u64::from(a.is_ok());
                    err += 1;
                    first_err.get_or_insert(start.elapsed());
                    last_err = Some(start.elapsed());
                }
            }
            if recovered_at.is_some_and(|r| start.elapsed() > r + Duration::from_secs(2)) {
                break;
            }
        }
        let failover_at = failover_at.unwrap();
        let recovered_at = recovered_at.expect("the store never followed the new master");
        assert_eq!(Group::role(&group.replica), "master");
        // Counted on the new master (the key's INCRs that replicated).
        let key = store.redis_key(b"count", &count);
        let counted = window_count(&group.replica, &key);
        let lost = ok.saturating_sub(counted);
        let error_window = match (first_err, last_err) {
            (Some(f), Some(l)) => l - f,
            _ => Duration::ZERO,
        };
        println!(
            "sentinel failover: {ok} admitted, {err} failed calls over {error_window:?}, \
             recovered {:?} after SENTINEL FAILOVER, {counted} counted on the new master, \
             {lost} admissions lost, cap: {cap_admitted} admitted of {cap_limit}",
            recovered_at - failover_at
        );
        // The switch is bounded: errors stop and the store answers again.
        assert!(recovered_at - failover_at < Duration::from_secs(15));
        assert!(error_window < Duration::from_secs(15));
        // Nothing counted that was not admitted, beyond calls that failed
        // after being applied.
        assert!(counted <= ok + err, "{counted} > {ok} + {err}");
        // The cap is exceeded by no more than what the failover lost.
        assert!(
            cap_admitted <= cap_limit + lost,
            "{cap_admitted} > {cap_limit} + {lost}"
        );
        // The last calls all succeeded on the new master.
        for _ in 0..20 {
            store.check(Charge::new(b"count", &count, 1)).await.unwrap();
        }
    });
}
