//! Malformed `Authorization` headers and duplicate identity headers.

use std::time::Duration;

use super::{from_peer, ok_service, Recorder};
use http::{HeaderValue, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{BearerToken, HeaderKey, KeyExtractor, PeerIp};
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

// ---------------------------------------------------------- Authorization ---

#[tokio::test]
async fn malformed_authorization_headers_are_missing_keys_and_tokens_are_hashed() {
    let store = Recorder::default();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let strict = ServiceBuilder::new()
        .layer(ThrottleLayer::new(store.clone(), policy).key(BearerToken))
        .service(ok_service());
    let malformed: Vec<HeaderValue> = [
        &b""[..],
        b"Bearer",
        b"Bearer ",
        b"Bearer    ",
        b"Bearer\t",
        b"Bearerabc",
        b"Basic dXNlcjpwYXNz",
        b"Digest username=\"x\"",
        b"Bear",
        b"B",
        b"\xff\xfe",
        b"Token abc",
    ]
    .iter()
    .map(|b| HeaderValue::from_bytes(b).unwrap())
    .collect();
    for v in &malformed {
        let req = from_peer("192.0.2.1:1", &[("authorization", v.clone())]);
        let status = strict.clone().oneshot(req).await.unwrap().status();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{v:?}");
    }
    // With a fallback, they are all one client: the peer.
    let fallback = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(
                MemoryStore::builder().clock(ManualClock::new()).build(),
                policy,
            )
            .key(BearerToken.or(PeerIp::new())),
        )
        .service(ok_service());
    let mut ok = 0;
    for v in &malformed {
        let req = from_peer("192.0.2.1:1", &[("authorization", v.clone())]);
        ok += u64::from(fallback.clone().oneshot(req).await.unwrap().status() == StatusCode::OK);
    }
    assert_eq!(ok, 1, "malformed tokens share the peer's bucket");

    // Odd but valid tokens: each its own bucket, never stored in the clear.
    let secret = "s3cr3t-{tag}-\u{7f}".replace('\u{7f}', "");
    let odd: Vec<HeaderValue> = vec![
        HeaderValue::from_str(&format!("Bearer {secret}")).unwrap(),
        HeaderValue::from_str(&format!("bEaReR   {secret}x  ")).unwrap(),
        HeaderValue::from_bytes(&[b"Bearer ".as_slice(), &vec![b'k'; 1 << 20]].concat()).unwrap(),
        HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
    ];
    for v in &odd {
        let req = from_peer("192.0.2.1:1", &[("authorization", v.clone())]);
        assert_eq!(
            strict.clone().oneshot(req).await.unwrap().status(),
            StatusCode::OK
        );
    }
    for k in store.keys.lock().unwrap().iter() {
        assert!(k.len() <= "default:".len() + 32, "{} bytes", k.len());
        assert!(!k.windows(6).any(|w| w == b"s3cr3t"), "token in the key");
    }
}

/// Two `Authorization` or two `x-user-id` lines: an auth layer may read
/// another line than the limiter, so the request is refused (the layer's
/// missing-key answer) and nothing is charged.
#[tokio::test]
async fn duplicate_identity_headers_are_refused() {
    let store = Recorder::default();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let user = ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(store.clone(), policy)
                .key(HeaderKey::new(http::HeaderName::from_static("x-user-id"))),
        )
        .service(ok_service());
    let bearer = ServiceBuilder::new()
        .layer(ThrottleLayer::new(store.clone(), policy).key(BearerToken))
        .service(ok_service());
    let v = |s: &str| HeaderValue::from_str(s).unwrap();
    let cases = [
        (&user, "x-user-id", [v("alice"), v("bob")]),
        (&user, "x-user-id", [v("alice"), v("alice")]),
        (&user, "x-user-id", [v(""), v("alice")]),
        (&bearer, "authorization", [v("Bearer a"), v("Bearer b")]),
        (&bearer, "authorization", [v("Bearer a"), v("Bearer a")]),
        (&bearer, "authorization", [v("Basic dTpw"), v("Bearer a")]),
    ];
    for (svc, name, [first, second]) in cases {
        let req = from_peer(
            "192.0.2.1:1",
            &[(name, first.clone()), (name, second.clone())],
        );
        let status = (*svc).clone().oneshot(req).await.unwrap().status();
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{name}: {first:?}, {second:?}"
        );
    }
    assert!(store.keys.lock().unwrap().is_empty(), "nothing charged");
    // One line of each: admitted once, then limited.
    for (svc, name, value) in [
        (&user, "x-user-id", v("alice")),
        (&bearer, "authorization", v("Bearer a")),
    ] {
        for want in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
            let req = from_peer("192.0.2.1:1", &[(name, value.clone())]);
            assert_eq!(
                (*svc).clone().oneshot(req).await.unwrap().status(),
                want,
                "{name}"
            );
        }
    }
}
