//! Connect-time checks against private `redis-server`s: credentials the
//! server wants or refuses, ACL users with the documented minimal rule and
//! without parts of it, and `allkeys-*` eviction policies. Every failure
//! must be a `StoreError::Config` naming the fix, never holding a password.

use crate::redis_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_support::{current_thread_runtime as runtime, RedisCluster, RedisServer};
use tower_throttle::clock::ManualClock;
use tower_throttle::store::redis::{RedisStore, RedisStoreBuilder, TimeSource};
use tower_throttle::store::CellStore;
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store, StoreError};

const PASSWORD: &str = "s3cret-Pa55";

/// The minimal rule documented on `RedisStoreBuilder::connect`, for the
/// prefix `app` (keep the two in step).
const MINIMAL_RULE: &[&str] = &[
    "~app:*",
    "+ping",
    "+evalsha",
    "+script|load",
    "+del",
    "+time",
    "+get",
    "+mget",
    "+set",
    "+incrby",
    "+pexpire",
    "+pttl",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyscore",
    "+zremrangebyrank",
    "+zcard",
    "+zcount",
];

fn builder() -> RedisStoreBuilder {
    RedisStore::builder()
        .prefix("app")
        .timeout(Duration::from_secs(5))
}

/// `on >pw` plus `rules`.
fn user(server: &RedisServer, name: &str, rules: &[&str]) {
    let mut all = vec!["on", ">pw"];
    all.extend_from_slice(rules);
    server.acl_user(name, &all);
}

fn without(rules: &[&'static str], drop: &str) -> Vec<&'static str> {
    rules.iter().copied().filter(|r| *r != drop).collect()
}

/// Waits, on `server`'s clock, until the next end of an aligned `window` is
/// at least `room` away, so that checks on server time made now see one
/// fixed window throughout (short of a stall of `room`). No wait at all in
/// most runs; at most `room`.
fn clear_of_a_window_end(server: &RedisServer, window: Duration, room: Duration) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut server.conn()).unwrap();
    let now = Duration::from_secs(secs) + Duration::from_micros(micros);
    let into = now.as_nanos() % window.as_nanos();
    let left = window - Duration::from_nanos(u64::try_from(into).unwrap());
    if left < room {
        std::thread::sleep(left + Duration::from_millis(10));
    }
}

fn config_error(r: Result<impl std::fmt::Debug, StoreError>) -> String {
    match r {
        Err(e @ StoreError::Config(_)) => e.to_string(),
        other => panic!("expected StoreError::Config, got {other:?}"),
    }
}

#[test]
fn requirepass_without_password_in_url_names_the_url() {
    let server = RedisServer::start_with_password(PASSWORD, &[]);
    let rt = runtime();
    let msg = config_error(rt.block_on(builder().connect(server.url())));
    assert!(msg.contains("requires a password or an ACL user"), "{msg}");
    assert!(msg.contains("redis://user:password@host/"), "{msg}");
    assert!(!msg.contains("unauthenticated"), "{msg}");
    assert!(!msg.contains(PASSWORD), "{msg}");

    // The same for CellStore, before it looks for the module.
    let msg = config_error(rt.block_on(CellStore::connect(builder(), server.url())));
    assert!(msg.contains("requires a password"), "{msg}");

    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port);
    // A frozen clock: on the server's a minute boundary between the two
    // checks would admit the second.
    let store = rt
        .block_on(
            builder()
                .time_source(TimeSource::client(ManualClock::new()))
                .connect(url),
        )
        .unwrap();
    let p = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let d = rt.block_on(store.check(Charge::new(b"k", &p, 1))).unwrap();
    assert!(d.allowed);
    assert!(
        !rt.block_on(store.check(Charge::new(b"k", &p, 1)))
            .unwrap()
            .allowed
    );
}

#[test]
fn refused_credentials_say_so_without_the_password() {
    let server = RedisServer::start_with_password(PASSWORD, &[]);
    user(&server, "limiter", MINIMAL_RULE);
    let rt = runtime();
    for url in [
        format!("redis://:wrong-{PASSWORD}@127.0.0.1:{}/", server.port),
        server.url_as("limiter", "not-pw"),
        server.url_as("nobody", PASSWORD),
    ] {
        let msg = config_error(rt.block_on(builder().connect(url)));
        assert!(msg.contains("refused the credentials"), "{msg}");
        assert!(!msg.contains(PASSWORD) && !msg.contains("not-pw"), "{msg}");
    }
}

#[test]
fn the_minimal_acl_rule_runs_every_algorithm() {
    let server = RedisServer::start();
    user(&server, "limiter", MINIMAL_RULE);
    let rt = runtime();
    let store = rt
        .block_on(builder().connect(server.url_as("limiter", "pw")))
        .unwrap();
    // CONFIG GET is not in the rule: the policy is unknown, not an error.
    assert_eq!(store.server_eviction_policy(), None);
    let w = Duration::from_secs(60);
    let policies = [
        Policy::cell(1, 2, w).unwrap(),
        Policy::fixed_window(2, w).unwrap(),
        Policy::sliding_window(2, w).unwrap(),
        Policy::sliding_log(2, w).unwrap(),
        Policy::concurrency(2).unwrap(),
    ];
    // On the server's clock, which the rule's `+time` is for: away from the
    // end of a minute, so the fixed window's denial below is not a new
    // window's admission.
    clear_of_a_window_end(&server, w, Duration::from_secs(5));
    rt.block_on(async {
        for p in &policies {
            let d = store.check(Charge::new(b"u", p, 1)).await.unwrap();
            assert!(d.allowed && d.remaining == 1, "{p:?}: {d:?}");
            if p.is_concurrency() {
                store.release(b"u", p, d.permit.unwrap()).await.unwrap();
            } else {
                let receipt = d.receipt().expect("an admitted charge");
                store.refund(b"u", p, &receipt).await.unwrap();
            }
            let d = store.check(Charge::new(b"u", p, 2)).await.unwrap();
            assert!(d.allowed && d.remaining == 0, "{p:?}: {d:?}");
            assert!(!store.check(Charge::new(b"u", p, 1)).await.unwrap().allowed);
            store.reset(b"u", p).await.unwrap();
            let d = store.check(Charge::new(b"u", p, 1)).await.unwrap();
            assert!(d.allowed && d.remaining == 1, "{p:?}: {d:?}");
        }
        // A check mixing every algorithm runs the full script.
        let keys: [&[u8]; 5] = [b"m1", b"m2", b"m3", b"m4", b"m5"];
        let rules: Vec<Charge> = keys
            .iter()
            .zip(&policies)
            .map(|(k, p)| Charge::new(k, p, 1))
            .collect();
        let all = store.check_all(&rules).await.unwrap();
        assert!(all.iter().all(|d| d.allowed), "{all:?}");
    });
    // An ACL tightened after connect: the scripts' refusal names the fix.
    user(&server, "limiter", &without(MINIMAL_RULE, "+zadd"));
    let err = rt
        .block_on(store.check(Charge::new(b"late", &policies[3], 1)))
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::Config(_)), "{err:?}");
    assert!(
        msg.contains("ACL user may not run a command or access a key"),
        "{msg}"
    );
}

#[test]
fn acl_user_without_time_is_refused_naming_time() {
    let server = RedisServer::start();
    user(&server, "limiter", &without(MINIMAL_RULE, "+time"));
    let rt = runtime();
    let msg = config_error(rt.block_on(builder().connect(server.url_as("limiter", "pw"))));
    assert!(
        msg.contains("may not run `time`") && msg.contains("+time"),
        "{msg}"
    );
    // A client clock spares the scripts TIME: the same user connects.
    let clock = ManualClock::new();
    let store = rt
        .block_on(
            builder()
                .time_source(TimeSource::client(clock))
                .connect(server.url_as("limiter", "pw")),
        )
        .unwrap();
    let p = Policy::cell(1, 2, Duration::from_secs(60)).unwrap();
    assert!(
        rt.block_on(store.check(Charge::new(b"k", &p, 1)))
            .unwrap()
            .allowed
    );
}

/// Every command of the minimal rule is needed, and its absence is named.
#[test]
fn acl_user_missing_any_command_is_refused_naming_it() {
    let server = RedisServer::start();
    let rt = runtime();
    for drop in MINIMAL_RULE.iter().filter(|r| r.starts_with('+')) {
        user(&server, "limiter", &without(MINIMAL_RULE, drop));
        let msg = config_error(rt.block_on(builder().connect(server.url_as("limiter", "pw"))));
        let name = format!("may not run `{}`", &drop[1..]);
        assert!(msg.contains(&name) && msg.contains(drop), "{drop}: {msg}");
    }
}

#[test]
fn acl_user_on_other_keys_is_refused_naming_the_prefix() {
    let server = RedisServer::start();
    let mut rules = without(MINIMAL_RULE, "~app:*");
    rules.push("~other:*");
    user(&server, "limiter", &rules);
    let rt = runtime();
    let msg = config_error(rt.block_on(builder().connect(server.url_as("limiter", "pw"))));
    assert!(
        msg.contains("`~app:*`") && msg.contains("prefix `app`"),
        "{msg}"
    );
    // Read-only access to the prefix is not enough either.
    let mut rules = without(MINIMAL_RULE, "~app:*");
    rules.push("%R~app:*");
    user(&server, "limiter", &rules);
    let msg = config_error(rt.block_on(builder().connect(server.url_as("limiter", "pw"))));
    assert!(msg.contains("`~app:*`"), "{msg}");
}

/// Collects the messages of `tracing` warnings.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        *meta.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut msg = String::new();
        event.record(&mut Message(&mut msg));
        self.0.lock().unwrap().push(msg);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn allkeys_eviction_warns_or_fails_when_required() {
    let server = RedisServer::start_with_args(&["--maxmemory-policy".into(), "allkeys-lru".into()]);
    let rt = runtime();
    let warnings = Warnings::default();
    let store = tracing::subscriber::with_default(warnings.clone(), || {
        rt.block_on(builder().connect(server.url())).unwrap()
    });
    assert_eq!(store.server_eviction_policy(), Some("allkeys-lru"));
    let seen = warnings.0.lock().unwrap().clone();
    assert!(
        seen.iter().any(|w| w.contains("allkeys-lru")
            && w.contains("resets their quotas")
            && w.contains("noeviction")),
        "{seen:?}"
    );

    let msg =
        config_error(rt.block_on(builder().require_safe_eviction(true).connect(server.url())));
    assert!(
        msg.contains("allkeys-lru") && msg.contains("volatile-*"),
        "{msg}"
    );
}

#[test]
fn noeviction_and_volatile_policies_pass_the_strict_check() {
    let rt = runtime();
    for policy in ["noeviction", "volatile-lru", "volatile-ttl"] {
        let server = RedisServer::start_with_args(&["--maxmemory-policy".into(), policy.into()]);
        let warnings = Warnings::default();
        let store = tracing::subscriber::with_default(warnings.clone(), || {
            rt.block_on(builder().require_safe_eviction(true).connect(server.url()))
                .unwrap()
        });
        assert_eq!(store.server_eviction_policy(), Some(policy));
        assert!(warnings.0.lock().unwrap().is_empty());
    }
}

#[test]
fn cluster_checks_every_master() {
    let cluster = RedisCluster::start();
    let urls = |c: &RedisCluster| -> Vec<String> {
        c.nodes.iter().map(|n| n.url_as("limiter", "pw")).collect()
    };
    let rt = runtime();
    // The cluster client reads the topology with CLUSTER SLOTS.
    for node in &cluster.nodes {
        user(node, "limiter", MINIMAL_RULE);
    }
    let msg = config_error(rt.block_on(builder().connect_cluster(urls(&cluster))));
    assert!(msg.contains("`cluster|slots`"), "{msg}");
    let mut rules = MINIMAL_RULE.to_vec();
    rules.push("+cluster|slots");
    for node in &cluster.nodes {
        user(node, "limiter", &rules);
    }
    let store = rt
        .block_on(builder().connect_cluster(urls(&cluster)))
        .unwrap();
    let p = Policy::sliding_log(1, Duration::from_secs(60)).unwrap();
    for key in [&b"a"[..], b"b", b"c", b"d"] {
        assert!(
            rt.block_on(store.check(Charge::new(key, &p, 1)))
                .unwrap()
                .allowed
        );
    }
    // ACL rules are per node: one master without TIME is found and named.
    let last = cluster.nodes.last().unwrap();
    user(last, "limiter", &without(&rules, "+time"));
    let msg = config_error(rt.block_on(builder().connect_cluster(urls(&cluster))));
    assert!(msg.contains("`time`"), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{}", last.port)), "{msg}");
}
