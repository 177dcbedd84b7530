//! `ThrottleLayer::peek_request` and `reset_request`: a client's state
//! under every rule, asked by what the app knows of it (a bearer token, a
//! header's value, an address, an extension), each rule running its own
//! extractor. On every store the keys peeked are the keys real requests
//! were charged to (a `Hottest` wrapper saw them, with their counts), and
//! the state peeked is what those requests left: on the memory store, on a
//! real redis-server, through a `FallbackStore` (Redis deciding, then the
//! fallback) and through a `LeasingStore` (units leased in process count
//! as spent on the shared store).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{HeaderName, Request, Response, StatusCode};
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::inspect::{Client, KeyStates};
use tower_throttle::key::{BearerToken, FromExtension, HeaderKey, PeerIp};
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::Hottest;
use tower_throttle::{MemoryStore, Policy, Rule, Store, ThrottleLayer};

const MIN: Duration = Duration::from_secs(60);
const USER: HeaderName = HeaderName::from_static("x-user");

/// What an auth layer puts in the extensions.
#[derive(Clone, Debug)]
struct Tenant(String);

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything the app knows of one client.
struct Who {
    token: String,
    user: String,
    ip: IpAddr,
    tenant: Tenant,
}

fn who(name: &str, octet: u8) -> Who {
    Who {
        token: format!("tok-{name}-s3cr3t"),
        user: format!("user|{name}"), // `|` is escaped in the key
        ip: IpAddr::from([203, 0, 113, octet]),
        tenant: Tenant(format!("t-{name}")),
    }
}

/// The rules, each keyed its own way, and their limits.
const LIMITS: [(&str, u64); 4] = [("token", 4), ("user", 6), ("ip", 6), ("tenant", 8)];

type Layered<S> = ThrottleLayer<Hottest<S, ManualClock>>;

fn layer<S: Store>(store: S, clock: &ManualClock, prefix: &str) -> Layered<S> {
    let store = Hottest::new(store, 64, MIN).clock(clock.clone());
    ThrottleLayer::new(store, Policy::fixed_window(4, MIN).unwrap())
        .name("token")
        .key(BearerToken)
        .and(Rule::new("user", Policy::sliding_log(6, MIN).unwrap()).key(HeaderKey::new(USER)))
        .and(Rule::new("ip", Policy::cell(5, 10, MIN).unwrap()).key(PeerIp::new()))
        .and(
            Rule::new("tenant", Policy::sliding_window(8, MIN).unwrap())
                .key(FromExtension::<Tenant>::new()),
        )
        .prefix(prefix)
}

/// One request as a server hands it to the layer: the peer's address as
/// axum records it (`ConnectInfo`), the tenant as an auth layer would.
async fn send<S: Store>(layer: &Layered<S>, who: &Who) -> StatusCode {
    let svc = layer
        .clone()
        .layer(tower::service_fn(|_: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        }));
    let mut req = Request::builder()
        .header("authorization", format!("Bearer {}", who.token))
        .header(USER, &who.user)
        .body(())
        .unwrap();
    let peer = SocketAddr::new(who.ip, 40_000);
    #[cfg(feature = "axum")]
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    #[cfg(not(feature = "axum"))]
    req.extensions_mut().insert(peer);
    req.extensions_mut().insert(who.tenant.clone());
    svc.oneshot(req).await.unwrap().status()
}

/// What an admin endpoint knows of the client, in one line.
fn client(who: &Who) -> Client {
    Client::bearer(&who.token)
        .and_header(USER, &who.user)
        .and_peer_ip(who.ip)
        .and_extension(who.tenant.clone())
}

fn key_of(states: &KeyStates, rule: &str) -> Vec<u8> {
    states.get(rule).unwrap().key.clone().unwrap().into_vec()
}

/// `sent` requests of `who`, `admitted` of them admitted: every rule's key
/// is one the requests were charged to (`sent` checks each, in the hottest
/// keys), and its state is the limit less the admitted units, counting the
/// units `local` says this process holds of it (a lease).
async fn assert_peeked<S: Store>(
    layer: &Layered<S>,
    who: &Who,
    sent: u64,
    admitted: u64,
    local: &dyn Fn(&S, &[u8]) -> u64,
) -> u64 {
    let states = layer.peek_request(&client(who)).await.unwrap();
    let mut held_in_all = 0;
    let hottest = layer.store().hottest_keys(64);
    for (rule, limit) in LIMITS {
        let state = states.get(rule).unwrap();
        let key = key_of(&states, rule);
        let d = state.decision.unwrap();
        let held = local(layer.store().inner(), &key);
        held_in_all += held;
        assert_eq!(d.limit, limit, "{rule}");
        assert_eq!(d.remaining + held, limit - admitted, "{rule}: {d:?}");
        let seen = hottest.by_checks.iter().find(|k| *k.key == *key);
        let seen = seen.unwrap_or_else(|| panic!("{rule}: {key:?} never charged: {hottest}"));
        assert_eq!((seen.count, seen.is_exact()), (sent, true), "{rule}");
    }
    // The bearer token is keyed by its digest, never by itself.
    let token = String::from_utf8(key_of(&states, "token")).unwrap();
    assert!(!token.contains(&who.token) && token.len() == "p:token:".len() + 32);
    held_in_all
}

/// Each identity alone reaches its own rule; the others report their
/// missing key, and the call succeeds.
async fn assert_each_identity_alone<S: Store>(layer: &Layered<S>, who: &Who) {
    let full = layer.peek_request(&client(who)).await.unwrap();
    let alone = [
        ("token", Client::bearer(&who.token)),
        ("user", Client::header(USER, &who.user)),
        ("ip", Client::peer_ip(who.ip)),
        ("tenant", Client::extension(who.tenant.clone())),
    ];
    for (rule, client) in alone {
        let states = layer.peek_request(&client).await.unwrap();
        for state in &states {
            if &*state.rule == rule {
                assert_eq!(state.key, full.get(rule).unwrap().key, "{rule}");
                let (d, expected) = (state.decision.unwrap(), full.get(rule).unwrap());
                assert_eq!(d.remaining, expected.decision.unwrap().remaining);
            } else {
                assert!(state.key.is_err() && state.decision.is_none(), "{state:?}");
            }
        }
    }
}

/// Two clients' requests (`a` and `b` of `prefix`, from `octet` and the
/// next), their peeks, a reset: on any store. Returns the units this
/// process held of their keys when first peeked.
async fn scenario<S: Store>(
    layer: &Layered<S>,
    (prefix, octet): (&str, u8),
    local: &dyn Fn(&S, &[u8]) -> u64,
) -> u64 {
    let a = who(&format!("{prefix}a"), octet);
    let b = who(&format!("{prefix}b"), octet + 1);
    for _ in 0..2 {
        assert_eq!(send(layer, &a).await, StatusCode::OK);
    }
    // b spends its token's 4, then is refused twice: all or nothing, so
    // its other rules are charged 4 as well.
    for i in 0..6 {
        let expected = [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS][usize::from(i >= 4)];
        assert_eq!(send(layer, &b).await, expected, "request {i}");
    }
    let held =
        assert_peeked(layer, &a, 2, 2, local).await + assert_peeked(layer, &b, 6, 4, local).await;
    // Again: a peek charges nothing.
    assert_peeked(layer, &a, 2, 2, local).await;
    assert_peeked(layer, &b, 6, 4, local).await;
    let denied = &layer.store().hottest_keys(8).by_denials;
    let b_token = key_of(&layer.peek_request(&client(&b)).await.unwrap(), "token");
    let b_denied = denied.iter().find(|k| *k.key == *b_token).map(|k| k.count);
    assert_eq!(b_denied, Some(2), "b's token alone denied, twice");
    assert_each_identity_alone(layer, &a).await;

    // A reset by identity forgets every rule's key of b, and only b's.
    let reset = layer.reset_request(&client(&b)).await.unwrap();
    assert!(reset.iter().all(|r| r.key.is_ok() && r.decision.is_none()));
    let states = layer.peek_request(&client(&b)).await.unwrap();
    for (rule, limit) in LIMITS {
        let d = states.get(rule).unwrap().decision.unwrap();
        assert_eq!(d.remaining, limit, "{rule} of b, reset");
    }
    assert_eq!(send(layer, &b).await, StatusCode::OK);
    assert_peeked(layer, &a, 2, 2, local).await;
    held
}

fn nothing_local<S>(_: &S, _: &[u8]) -> u64 {
    0
}

#[tokio::test]
async fn peeks_by_identity_on_the_memory_store() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder().clock(clock.clone()).build();
    scenario(&layer(store, &clock, "p"), ("m", 1), &nothing_local).await;
}

#[tokio::test]
async fn peeks_by_identity_through_a_leasing_store_over_memory() {
    let clock = ManualClock::new();
    let shared = MemoryStore::builder().clock(clock.clone()).build();
    let leasing = LeasingStore::builder(shared)
        .clock(clock.clone())
        .hot_threshold(1)
        .prefetch(false)
        .build()
        .unwrap();
    let local = |s: &LeasingStore<MemoryStore<ManualClock>>, k: &[u8]| s.local_units(k);
    let held = scenario(&layer(leasing, &clock, "p"), ("l", 1), &local).await;
    assert!(
        held > 0,
        "some units were leased, so the peek had them to count"
    );
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::redis_support::{current_thread_runtime, RedisServer};
    use tower_throttle::store::redis::{RedisStore, TimeSource};
    use tower_throttle::store::FallbackStore;

    async fn redis(server: &RedisServer, clock: &ManualClock) -> RedisStore {
        RedisStore::builder()
            .prefix("ident")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
            .connect(server.url().as_str())
            .await
            .unwrap()
    }

    #[test]
    fn peeks_by_identity_on_redis() {
        let server = RedisServer::start();
        current_thread_runtime().block_on(async {
            let clock = ManualClock::new();
            let store = redis(&server, &clock).await;
            scenario(&layer(store, &clock, "p"), ("r", 1), &nothing_local).await;
        });
    }

    #[test]
    fn peeks_by_identity_through_a_leasing_store_over_redis() {
        let server = RedisServer::start();
        current_thread_runtime().block_on(async {
            let clock = ManualClock::new();
            let leasing = LeasingStore::builder(redis(&server, &clock).await)
                .clock(clock.clone())
                .hot_threshold(1)
                .prefetch(false)
                .build()
                .unwrap();
            let local = |s: &LeasingStore<RedisStore>, k: &[u8]| s.local_units(k);
            let held = scenario(&layer(leasing, &clock, "p"), ("l", 1), &local).await;
            assert!(
                held > 0,
                "some units were leased, so the peek had them to count"
            );
        });
    }

    /// Redis decides, then dies: the fallback decides, and the peek reads
    /// the store deciding, through the same layer.
    #[test]
    fn peeks_by_identity_through_a_fallback_store() {
        let mut server = RedisServer::start();
        current_thread_runtime().block_on(async {
            let clock = ManualClock::new();
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            // The clock stands still: once Redis failed, the fallback
            // decides until the test says otherwise.
            let store = FallbackStore::new(redis(&server, &clock).await, memory)
                .clock(clock.clone())
                .probe_interval(Duration::from_secs(3600));
            let layer = layer(store, &clock, "p");
            scenario(&layer, ("f", 1), &nothing_local).await;
            server.stop();
            scenario(&layer, ("o", 3), &nothing_local).await;
            assert!(layer.store().inner().is_on_fallback());
        });
    }
}
