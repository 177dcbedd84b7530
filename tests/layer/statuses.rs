//! The layer's own statuses and what its responses may reveal: a server
//! misconfiguration is a 500, a missing credential a 401, a failing store a
//! 503 with `Retry-After`; no response carries store errors, key names,
//! prefixes or token hashes. Also: layers on one store never share counters
//! by accident, and `t` is the time until more quota, not the full reset.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Empty;
use tower::{Layer, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::PermitId;
use tower_throttle::key::{BearerToken, Global};
use tower_throttle::response::{RATELIMIT, X_RATELIMIT_RESET};
use tower_throttle::{MemoryStore, Policy, Store, StoreError, ThrottleLayer};

const PREFIX: &str = "secretpfx";
const STORE_ERROR: &str = "WRONGTYPE secretpfx:default:198.51.100.7 internal detail";
const PEER: &str = "198.51.100.7:4000";
const TOKEN: &str = "tok-3f9a1c";

fn ok_service(
) -> impl tower::Service<Request<()>, Response = Response<Empty<Bytes>>, Error = Infallible> + Clone
{
    tower::service_fn(|_req: Request<()>| async { Ok(Response::new(Empty::new())) })
}

fn request(peer: Option<&str>, token: Option<&str>) -> Request<()> {
    let mut req = Request::new(());
    if let Some(peer) = peer {
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
    }
    if let Some(token) = token {
        req.headers_mut().insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
        );
    }
    req
}

/// A store that always fails with a message full of internals.
#[derive(Clone)]
struct Failing;

impl Store for Failing {
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        let _ = charges;
        tower_throttle::store::Answer::Later(async move {
            Err(StoreError::Protocol(STORE_ERROR.into()))
        })
    }
    async fn refund(
        &self,
        _: &[u8],
        _: &Policy,
        _: &tower_throttle::decision::Receipt,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn reset(&self, _: &[u8], _: &Policy) -> Result<(), StoreError> {
        Ok(())
    }
    async fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Status, and every header and the body as one text to scan.
async fn run<St: Store>(layer: &ThrottleLayer<St>, req: Request<()>) -> (StatusCode, String) {
    let response = layer.layer(ok_service()).oneshot(req).await.unwrap();
    let mut text = String::new();
    for (name, value) in response.headers() {
        text.push_str(&format!(
            "{name}: {}\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    text.push_str(&String::from_utf8_lossy(&body));
    (status, text)
}

/// No store error, prefix, key part, token or hex digest (a token hash) in
/// a response.
fn assert_no_leak(what: &str, text: &str) {
    for secret in [
        PREFIX,
        "WRONGTYPE",
        "internal detail",
        "198.51.100.7",
        TOKEN,
    ] {
        assert!(!text.contains(secret), "{what} leaks {secret:?}:\n{text}");
    }
    for secret in ["into_make_service", "ConnectInfo", "SocketAddr"] {
        assert!(
            !text.contains(secret),
            "{what} leaks server internals:\n{text}"
        );
    }
    let longest_hex = text
        .split(|c: char| !c.is_ascii_hexdigit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(longest_hex < 16, "{what} carries a digest:\n{text}");
}

#[tokio::test]
async fn every_response_kind_has_its_status_and_leaks_nothing() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    for problem_json in [false, true] {
        let body = |l: ThrottleLayer<MemoryStore<ManualClock>>| {
            if problem_json {
                l.problem_json_body()
            } else {
                l
            }
        };
        // 429, with the IETF and legacy fields. A clock that stands still:
        // a minute boundary between two requests would admit the second.
        let store = MemoryStore::builder().clock(ManualClock::new()).build();
        let limited = body(
            ThrottleLayer::new(store.clone(), policy)
                .prefix(PREFIX)
                .legacy_headers(true),
        );
        assert_eq!(
            run(&limited, request(Some(PEER), None)).await.0,
            StatusCode::OK
        );
        let (status, text) = run(&limited, request(Some(PEER), None)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_no_leak("429", &text);

        // 500: no peer address is the server's configuration, not the client.
        let (status, text) = run(&limited, request(None, None)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(text.contains("Internal server error: rate limiting is misconfigured (the server does not pass the client's network address"), "{text}");
        assert_no_leak("500", &text);

        // 401: a missing credential is the client's.
        let bearer = body(
            ThrottleLayer::new(store.clone(), policy)
                .key(BearerToken)
                .prefix("bearer-secretpfx"),
        );
        let (status, text) = run(&bearer, request(Some(PEER), None)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_no_leak("401", &text);
        // A token's 429 names neither the token nor its hash.
        assert_eq!(
            run(&bearer, request(Some(PEER), Some(TOKEN))).await.0,
            StatusCode::OK
        );
        let (status, text) = run(&bearer, request(Some(PEER), Some(TOKEN))).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_no_leak("429 by token", &text);

        // 503, with a Retry-After.
        let failing = ThrottleLayer::new(Failing, policy).prefix(PREFIX);
        let failing = if problem_json {
            failing.problem_json_body()
        } else {
            failing
        };
        let (status, text) = run(&failing, request(Some(PEER), Some(TOKEN))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("retry-after: 1\n"), "{text}");
        assert_no_leak("503", &text);
    }
}

#[test]
fn two_layers_on_one_store_do_not_share_counters_by_accident() {
    let store = MemoryStore::new();
    let policy = Policy::fixed_window(5, Duration::from_secs(60)).unwrap();
    let posts = ThrottleLayer::new(store.clone(), policy);
    let _posts_service = posts.layer(ok_service());
    // A clone is the same layer (one limit over several routes): fine.
    let _again = posts.clone().layer(ok_service());
    let replies = ThrottleLayer::new(store.clone(), policy);
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        replies.layer(ok_service());
    }));
    let message = *refused.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("\"default:\""), "{message}");
    assert!(
        message.contains(".prefix(") && message.contains(".share_counters()"),
        "{message}"
    );
    // Its own prefix, or sharing on purpose, builds.
    let _replies = ThrottleLayer::new(store.clone(), policy)
        .prefix("reply")
        .layer(ok_service());
    let _shared = ThrottleLayer::new(store.clone(), policy)
        .share_counters()
        .layer(ok_service());
    // Another store instance is another set of counters.
    let _elsewhere = ThrottleLayer::new(MemoryStore::new(), policy).layer(ok_service());
}

#[test]
fn a_dropped_layer_frees_its_namespace() {
    let store = MemoryStore::new();
    let policy = Policy::fixed_window(5, Duration::from_secs(60)).unwrap();
    let first = ThrottleLayer::new(store.clone(), policy).layer(ok_service());
    drop(first);
    let _second = ThrottleLayer::new(store, policy).layer(ok_service());
}

/// The ugc example's shape: 1 post a minute within 30 an hour... here a
/// token bucket of 10 refilled 1/s, drained: `t` is 1 s (the next unit),
/// the full reset 10 s stays in `X-RateLimit-Reset`, and `Retry-After` ≥ `t`.
#[tokio::test]
async fn t_is_the_time_until_more_quota() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    let layer = ThrottleLayer::new(store, Policy::token_bucket(10, 1.0).unwrap())
        .key(Global)
        .legacy_headers(true)
        .headers_on_allowed(true);
    let svc = layer.layer(ok_service());
    for _ in 0..10 {
        let r = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()[RATELIMIT], "\"default\";r=0;t=1");
    assert_eq!(r.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(r.headers()[X_RATELIMIT_RESET], "10");
    clock.advance(Duration::from_millis(2500));
    let r = svc.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // 2.5 units back, one spent: 1 left, the next in 0.5 s (rounded up).
    assert_eq!(r.headers()[RATELIMIT], "\"default\";r=1;t=1");
    assert_eq!(r.headers()[X_RATELIMIT_RESET], "9");
}

/// The header switches of a 429: the IETF fields by default, the legacy
/// ones on request, either without the other.
#[tokio::test]
async fn header_switches_choose_the_fields_of_a_429() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    for (ietf, legacy) in [(true, false), (false, true), (true, true), (false, false)] {
        let store = MemoryStore::builder().clock(ManualClock::new()).build();
        let layer = ThrottleLayer::new(store, policy)
            .key(Global)
            .ietf_headers(ietf)
            .legacy_headers(legacy);
        assert_eq!(run(&layer, Request::new(())).await.0, StatusCode::OK);
        let (status, text) = run(&layer, Request::new(())).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let has = |name: &str| text.lines().any(|l| l.starts_with(&format!("{name}: ")));
        assert_eq!(has("ratelimit"), ietf, "{text}");
        assert_eq!(has("ratelimit-policy"), ietf, "{text}");
        assert_eq!(has("x-ratelimit-limit"), legacy, "{text}");
        assert_eq!(has("x-ratelimit-remaining"), legacy, "{text}");
        assert_eq!(has("x-ratelimit-reset"), legacy, "{text}");
        assert!(has("retry-after"), "{text}");
    }
}
