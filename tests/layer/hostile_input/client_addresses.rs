//! Spoofed or non-ASCII forwarding headers never move a client's key.

use std::time::Duration;

use super::{from_peer, ok_service, Recorder};
use http::{HeaderValue, Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{
    ClientIp, ForwardedHeader, KeyExtractor, KeyWriter, PeerIp, RequestHead,
};
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

// ------------------------------------------------------- client addresses ---

/// 100 requests from one untrusted peer, each with different spoofed
/// forwarding headers: they all share one key, so exactly the limit passes.
async fn spoofing_changes_nothing(extractor: impl KeyExtractor + Clone, peer: &str) -> u64 {
    let svc = ServiceBuilder::new()
        .layer(
            // A manual clock: a minute boundary inside the loop would
            // open a second window and admit 20.
            ThrottleLayer::new(
                MemoryStore::builder().clock(ManualClock::new()).build(),
                Policy::fixed_window(10, Duration::from_secs(60)).unwrap(),
            )
            .key(extractor),
        )
        .service(ok_service());
    let mut ok = 0;
    for i in 0..100u32 {
        let fake = format!("{}.{}.{}.{}", i % 250 + 1, i % 7, i % 13, i % 250 + 3);
        let headers = [
            ("x-forwarded-for", format!("{fake}, 10.0.0.{}", i % 250)),
            ("x-forwarded-for", format!("203.0.113.{}", i % 250)),
            (
                "forwarded",
                format!("for={fake};proto=https, for=\"[2001:db8::{i:x}]\""),
            ),
            ("x-real-ip", fake.clone()),
            ("true-client-ip", fake.clone()),
            ("cf-connecting-ip", fake),
        ];
        let headers: Vec<(&str, HeaderValue)> = headers
            .iter()
            .map(|(n, v)| (*n, HeaderValue::from_str(v).unwrap()))
            .collect();
        let status = svc
            .clone()
            .oneshot(from_peer(peer, &headers))
            .await
            .unwrap()
            .status();
        ok += u64::from(status == StatusCode::OK);
    }
    ok
}

#[tokio::test]
async fn spoofed_forwarding_headers_from_untrusted_peers_never_change_the_key() {
    let trusting = ClientIp::new().trust("10.0.0.0/8".parse().unwrap());
    let cases: Vec<(&str, u64)> = vec![
        (
            "peer ip",
            spoofing_changes_nothing(PeerIp::new(), "198.51.100.7:5000").await,
        ),
        (
            "client ip, no trusted proxy",
            spoofing_changes_nothing(ClientIp::new(), "198.51.100.7:5000").await,
        ),
        (
            "client ip, untrusted peer",
            spoofing_changes_nothing(trusting.clone(), "198.51.100.7:5000").await,
        ),
        (
            "client ip (Forwarded), untrusted peer",
            spoofing_changes_nothing(
                trusting.clone().header(ForwardedHeader::Forwarded),
                "198.51.100.7:5000",
            )
            .await,
        ),
        (
            "client ip, untrusted IPv6 peer rotating in its /56",
            spoofing_changes_nothing(trusting, "[2001:db8:1:2ff::9]:5000").await,
        ),
    ];
    for (what, ok) in cases {
        assert_eq!(ok, 10, "{what}: {ok} admitted of 100 spoofed requests");
    }
}

#[test]
fn behind_a_trusted_proxy_only_the_rightmost_untrusted_hop_counts() {
    let ip = ClientIp::new().trust("10.0.0.0/8".parse().unwrap());
    let key = |headers: &[(&str, &str)]| {
        let headers: Vec<(&str, HeaderValue)> = headers
            .iter()
            .map(|(n, v)| (*n, HeaderValue::from_str(v).unwrap()))
            .collect();
        let req = from_peer("10.0.0.1:1", &headers);
        let mut buf = Vec::new();
        ip.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut buf))
            .unwrap();
        String::from_utf8(buf).unwrap()
    };
    let honest = key(&[("x-forwarded-for", "203.0.113.5, 10.0.0.9")]);
    assert_eq!(honest, "203.0.113.5");
    for spoof in [
        "1.1.1.1, 203.0.113.5, 10.0.0.9",
        "::1, 203.0.113.5, 10.0.0.9",
        "garbage, 203.0.113.5, 10.0.0.9",
        "10.0.0.3, 203.0.113.5, 10.0.0.9",
    ] {
        assert_eq!(key(&[("x-forwarded-for", spoof)]), honest, "{spoof}");
    }
    // X-Real-IP is never consulted.
    assert_eq!(
        key(&[("x-forwarded-for", "203.0.113.5"), ("x-real-ip", "6.6.6.6")]),
        honest
    );
    // A header of thousands of hops is cut off, not walked forever.
    let long: String = (0..10_000)
        .map(|i| format!("10.{}.{}.1", i / 250 % 250, i % 250))
        .collect::<Vec<_>>()
        .join(", ");
    let k = key(&[("x-forwarded-for", &long)]);
    assert!(k.starts_with("10."), "{k}");
}

/// Behind a trusted proxy that appends to the forwarding header, bytes a
/// client writes that are not ASCII (invalid UTF-8, obs-text) never move it
/// into the proxy's bucket, nor let it reset its quota, nor touch another
/// client's bucket; a proxy that reports garbage for a client keys that
/// client apart from everyone.
#[tokio::test]
async fn non_ascii_forwarding_bytes_never_move_a_client_into_the_proxy_bucket() {
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let (name, node): (&str, fn(&str) -> String) = match header {
            ForwardedHeader::XForwardedFor => ("x-forwarded-for", |ip| ip.to_string()),
            _ => ("forwarded", |ip| format!("for={ip};proto=https")),
        };
        let store = Recorder::default();
        let svc = ServiceBuilder::new()
            .layer(
                ThrottleLayer::new(
                    store.clone(),
                    Policy::fixed_window(3, Duration::from_secs(60)).unwrap(),
                )
                .key(
                    ClientIp::new()
                        .trust("10.0.0.0/8".parse().unwrap())
                        .header(header),
                )
                .prefix("n"),
            )
            .service(ok_service());
        // What the proxy at 10.0.0.1 sends: the client's bytes, then ", "
        // and the address it received from (or a line of its own).
        let via_proxy = |client_bytes: &[u8], client: &str, own_line: bool| {
            let appended = node(client);
            let lines: Vec<HeaderValue> = if own_line {
                vec![
                    HeaderValue::from_bytes(client_bytes).unwrap(),
                    HeaderValue::from_str(&appended).unwrap(),
                ]
            } else {
                let line = [client_bytes, b", ", appended.as_bytes()].concat();
                vec![HeaderValue::from_bytes(&line).unwrap()]
            };
            let headers: Vec<(&str, HeaderValue)> = lines.into_iter().map(|v| (name, v)).collect();
            from_peer("10.0.0.1:1", &headers)
        };
        let status = |req: Request<()>| {
            let svc = svc.clone();
            async move { svc.oneshot(req).await.unwrap().status() }
        };
        let hostile: [&[u8]; 6] = [
            b"\xff",
            b"\x80abc",
            b"6.6.6.6\xfe",
            b"for=\"\xff",
            "é, 1.1.1.1".as_bytes(),
            b"\xa0\xa0, \xff",
        ];
        // Client A spends its 3 requests, then varies its bytes: still refused.
        for (i, bytes) in hostile.iter().enumerate() {
            let want = if i < 3 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            let req = via_proxy(bytes, "198.51.100.7", i % 2 == 1);
            assert_eq!(status(req).await, want, "{header:?} client A, request {i}");
        }
        // Client B with the same bytes has its own quota.
        for bytes in &hostile[..3] {
            let req = via_proxy(bytes, "198.51.100.8", false);
            assert_eq!(status(req).await, StatusCode::OK, "{header:?} client B");
        }
        // The proxy's own bucket was never charged by either.
        for _ in 0..3 {
            let req = from_peer("10.0.0.1:1", &[]);
            assert_eq!(status(req).await, StatusCode::OK, "{header:?} proxy");
        }
        // A proxy that reports garbage for a client: its own bucket, bounded.
        let garbage = [&b"\xff\xfe"[..], &vec![0xffu8; 1 << 16]];
        for g in garbage {
            let line = match header {
                ForwardedHeader::XForwardedFor => [&b"198.51.100.7, "[..], g].concat(),
                _ => [&b"for=198.51.100.7, for=\""[..], g, b"\""].concat(),
            };
            let req = from_peer(
                "10.0.0.1:1",
                &[(name, HeaderValue::from_bytes(&line).unwrap())],
            );
            assert_eq!(status(req).await, StatusCode::OK, "{header:?} garbage");
        }
        let keys = store.keys.lock().unwrap().clone();
        let proxy_key = b"n:default:10.0.0.1".to_vec();
        assert_eq!(keys.iter().filter(|k| **k == proxy_key).count(), 3);
        let last = &keys[keys.len() - 2..];
        assert_eq!(last[0], b"n:default:?\xff\xfe");
        assert!(last[1].starts_with(b"n:default:#") && last[1].len() == 10 + 33);
    }
}
