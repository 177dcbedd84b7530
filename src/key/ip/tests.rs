//! Tests of the address extractors and CIDR parsing.
use super::*;

fn key_of(extractor: &impl KeyExtractor, req: &http::Request<()>) -> Result<String, MissingKey> {
    let mut buf = Vec::new();
    extractor.extract(&RequestHead::new(req), &mut KeyWriter::new(&mut buf))?;
    Ok(String::from_utf8(buf).unwrap())
}

fn request(peer: &str, headers: &[(&str, &str)]) -> http::Request<()> {
    let mut b = http::Request::builder();
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    let mut req = b.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

fn proxies() -> ClientIp {
    ClientIp::new().trust_all(["10.0.0.0/8".parse().unwrap(), "fd00::/8".parse().unwrap()])
}

#[test]
fn ipv6_is_grouped_and_mapped_ipv4_is_ipv4() {
    let r = request("[2001:db8:aa:bbcc::1]:1", &[]);
    assert_eq!(key_of(&PeerIp::new(), &r).unwrap(), "2001:db8:aa:bb00::/56");
    assert_eq!(
        key_of(&PeerIp::new().ipv6_prefix(64), &r).unwrap(),
        "2001:db8:aa:bbcc::/64"
    );
    assert_eq!(
        key_of(&PeerIp::new().ipv6_prefix(200), &r).unwrap(),
        "2001:db8:aa:bbcc::1"
    );
    let mapped = request("[::ffff:192.0.2.1]:1", &[]);
    assert_eq!(key_of(&PeerIp::new(), &mapped).unwrap(), "192.0.2.1");
    // Two addresses of one /56 share a key.
    let other = request("[2001:db8:aa:bb01:ffff::2]:1", &[]);
    assert_eq!(key_of(&PeerIp::new(), &r), key_of(&PeerIp::new(), &other));
}

#[test]
fn without_a_peer_the_key_is_missing() {
    let req = http::Request::new(());
    assert!(key_of(&PeerIp::new(), &req).is_err());
    assert!(key_of(&proxies(), &req).is_err());
}

#[test]
fn untrusted_peer_ignores_headers() {
    let r = request("198.51.100.1:1", &[("x-forwarded-for", "1.1.1.1")]);
    assert_eq!(key_of(&proxies(), &r).unwrap(), "198.51.100.1");
    // No trusted proxies at all: always the peer.
    let r = request("10.0.0.1:1", &[("x-forwarded-for", "1.1.1.1")]);
    assert_eq!(key_of(&ClientIp::new(), &r).unwrap(), "10.0.0.1");
}

#[test]
fn rightmost_untrusted_hop_wins_and_spoofing_is_ignored() {
    let honest = request(
        "10.0.0.1:1",
        &[("x-forwarded-for", "203.0.113.9, 10.1.1.1")],
    );
    let spoofed = request(
        "10.0.0.1:1",
        &[("x-forwarded-for", "6.6.6.6, 7.7.7.7, 203.0.113.9, 10.1.1.1")],
    );
    assert_eq!(key_of(&proxies(), &honest).unwrap(), "203.0.113.9");
    assert_eq!(key_of(&proxies(), &spoofed).unwrap(), "203.0.113.9");
    // Several header lines: the last line is the nearest hop.
    let lines = request(
        "10.0.0.1:1",
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.9:4321"),
        ],
    );
    assert_eq!(key_of(&proxies(), &lines).unwrap(), "203.0.113.9");
}

#[test]
fn malformed_or_all_trusted_stops_at_the_last_known_hop() {
    for xff in ["garbage", "1.2.3.4, unknown", "", " , ", "300.1.1.1"] {
        let r = request("10.0.0.1:1", &[("x-forwarded-for", xff)]);
        assert_eq!(key_of(&proxies(), &r).unwrap(), "10.0.0.1", "{xff:?}");
    }
    let r = request(
        "10.0.0.1:1",
        &[("x-forwarded-for", "5.5.5.5, bogus, 10.0.0.7")],
    );
    assert_eq!(key_of(&proxies(), &r).unwrap(), "10.0.0.7");
    let r = request("10.0.0.1:1", &[("x-forwarded-for", "10.0.0.3, 10.0.0.2")]);
    assert_eq!(key_of(&proxies(), &r).unwrap(), "10.0.0.3");
    let mut r = request("10.0.0.1:1", &[]);
    r.headers_mut().insert(
        "x-forwarded-for",
        http::HeaderValue::from_bytes(b"1.2.3.4\xff").unwrap(),
    );
    assert_eq!(key_of(&proxies(), &r).unwrap(), "10.0.0.1");
}

#[test]
fn forwarded_header() {
    let ip = proxies().header(ForwardedHeader::Forwarded);
    let r = request(
        "10.0.0.1:1",
        &[(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https, For=10.2.2.2;by=10.0.0.1",
        )],
    );
    assert_eq!(key_of(&ip, &r).unwrap(), "2001:db8:cafe::/56");
    let r = request("10.0.0.1:1", &[("forwarded", "for=unknown")]);
    assert_eq!(key_of(&ip, &r).unwrap(), "10.0.0.1");
    let r = request("10.0.0.1:1", &[("forwarded", "proto=https")]);
    assert_eq!(key_of(&ip, &r).unwrap(), "10.0.0.1");
}

#[test]
fn cidr_parsing_and_matching() {
    let c: Cidr = "10.1.2.3/8".parse().unwrap();
    assert_eq!(c.to_string(), "10.0.0.0/8");
    assert!(c.contains("10.255.0.1".parse().unwrap()));
    assert!(c.contains("::ffff:10.0.0.1".parse().unwrap()));
    assert!(!c.contains("11.0.0.1".parse().unwrap()));
    assert!(!c.contains("::1".parse().unwrap()));
    let all: Cidr = "0.0.0.0/0".parse().unwrap();
    assert!(all.contains("1.2.3.4".parse().unwrap()));
    let host: Cidr = "::1".parse().unwrap();
    assert!(host.contains("::1".parse().unwrap()));
    assert!(!host.contains("::2".parse().unwrap()));
    for bad in ["10.0.0.0/33", "::/129", "nonsense", "10.0.0.0/x", ""] {
        assert!(bad.parse::<Cidr>().is_err(), "{bad}");
    }
}
