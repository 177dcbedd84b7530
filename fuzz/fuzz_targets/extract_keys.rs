//! Header / IP / key extraction on arbitrary requests: never a panic, and
//! the security properties hold whatever the client sends.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use arbitrary::Arbitrary;
use http::{HeaderName, HeaderValue, Request};
use libfuzzer_sys::fuzz_target;
use tower_throttle::key::{
    BearerToken, Cidr, ClientIp, ForwardedHeader, HeaderKey, KeyExtractor, KeyWriter, PeerIp,
    RequestHead, UriPath,
};

#[derive(Arbitrary, Debug)]
struct Input {
    peer_v6: bool,
    peer: [u8; 16],
    v6_prefix: u8,
    trusted: Vec<String>,
    forwarded_style: bool,
    headers: Vec<(u8, Vec<u8>)>,
    path: String,
    segments: u8,
    writer_bytes: Vec<u8>,
}

const NAMES: [&str; 6] = [
    "x-forwarded-for",
    "forwarded",
    "authorization",
    "x-real-ip",
    "x-api-key",
    "cookie",
];

fn key(x: &impl KeyExtractor, req: &Request<()>) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    x.extract(&RequestHead::new(req), &mut KeyWriter::new(&mut buf))
        .ok()
        .map(|()| buf)
}

fuzz_target!(|input: Input| {
    let peer = if input.peer_v6 {
        IpAddr::V6(Ipv6Addr::from(input.peer))
    } else {
        let [a, b, c, d, ..] = input.peer;
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    };
    let mut req = Request::new(());
    if let Ok(uri) = input.path.parse() {
        *req.uri_mut() = uri;
    }
    for (n, v) in &input.headers {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            let name = HeaderName::from_static(NAMES[usize::from(*n) % NAMES.len()]);
            req.headers_mut().append(name, v);
        }
    }
    let bare = {
        let mut r = Request::new(());
        r.extensions_mut().insert(SocketAddr::new(peer, 443));
        r
    };
    req.extensions_mut().insert(SocketAddr::new(peer, 443));

    // Cidr parsing never panics; a parsed range contains its own address.
    let mut trusted = Vec::new();
    for t in &input.trusted {
        if let Ok(c) = t.parse::<Cidr>() {
            let _ = c.to_string();
            trusted.push(c);
        }
    }
    let peer_key = key(&PeerIp::new().ipv6_prefix(input.v6_prefix), &req).expect("a peer");
    // Headers never change the peer's key.
    assert_eq!(
        Some(&peer_key),
        key(&PeerIp::new().ipv6_prefix(input.v6_prefix), &bare).as_ref()
    );

    let header = if input.forwarded_style {
        ForwardedHeader::Forwarded
    } else {
        ForwardedHeader::XForwardedFor
    };
    let client = ClientIp::new()
        .trust_all(trusted.iter().copied())
        .header(header)
        .ipv6_prefix(input.v6_prefix);
    let client_key = key(&client, &req).expect("a peer");
    // An untrusted peer is the client, whatever it claims.
    if !trusted.iter().any(|c| c.contains(peer)) {
        assert_eq!(client_key, peer_key);
    }
    // No proxy trusted: always the peer.
    let untrusting = ClientIp::new().header(header).ipv6_prefix(input.v6_prefix);
    assert_eq!(key(&untrusting, &req), Some(peer_key));

    // Bearer tokens: a 32-hex-digit digest or nothing.
    if let Some(k) = key(&BearerToken, &req) {
        assert_eq!(k.len(), 32);
        assert!(k.iter().all(u8::is_ascii_hexdigit));
    }
    // Header keys are escaped: no separator or control byte survives.
    let api = HeaderKey::new(HeaderName::from_static("x-api-key"));
    for k in [
        key(&api, &req),
        key(&(api.clone(), BearerToken.or(PeerIp::new())), &req),
    ]
    .into_iter()
    .flatten()
    {
        assert!(k.iter().all(|&b| b >= 0x20 && b != 0x7f), "{k:?}");
    }
    if let Some(k) = key(&api, &req) {
        assert!(!k.contains(&b'|') && !k.contains(&b'~'));
    }
    let _ = key(&UriPath::first_segments(usize::from(input.segments)), &req);
    let _ = key(&UriPath::full(), &req);

    // The writer's escaping is injective on what it is given.
    let mut a = Vec::new();
    KeyWriter::new(&mut a).push(&input.writer_bytes);
    assert!(!a.contains(&b'|'));
    assert!(a.len() >= input.writer_bytes.len());
});
