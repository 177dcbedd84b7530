//! Tests of the address extractors and CIDR parsing.
use super::*;

fn key_bytes(
    extractor: &impl KeyExtractor,
    req: &http::Request<()>,
) -> Result<Vec<u8>, MissingKey> {
    let mut buf = Vec::new();
    extractor.extract(&RequestHead::new(req), &mut KeyWriter::new(&mut buf))?;
    Ok(buf)
}

fn key_of(extractor: &impl KeyExtractor, req: &http::Request<()>) -> Result<String, MissingKey> {
    key_bytes(extractor, req).map(|k| String::from_utf8(k).unwrap())
}

/// A request from `peer` with one `name` line per element of `lines`.
fn raw_request(peer: &str, name: &'static str, lines: &[&[u8]]) -> http::Request<()> {
    let mut req = request(peer, &[]);
    for line in lines {
        req.headers_mut()
            .append(name, http::HeaderValue::from_bytes(line).unwrap());
    }
    req
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
fn an_unparsable_nearest_hop_is_an_opaque_key_never_the_proxy() {
    for (xff, want) in [
        ("garbage", "?garbage"),
        ("1.2.3.4, unknown", "?unknown"),
        ("300.1.1.1", "?300.1.1.1"),
        ("5.5.5.5, bogus, 10.0.0.7", "?bogus"),
        ("5.5.5.5, a|b~%, 10.0.0.7", "?a%7cb%7e%25"),
        ("fe80::1%eth0", "?fe80::1%25eth0"),
        // No hop at all: the proxy reported nothing, the peer is the key.
        ("", "10.0.0.1"),
        (" , ", "10.0.0.1"),
        // Every hop trusted: the leftmost.
        ("10.0.0.3, 10.0.0.2", "10.0.0.3"),
    ] {
        let r = request("10.0.0.1:1", &[("x-forwarded-for", xff)]);
        assert_eq!(key_of(&proxies(), &r).unwrap(), want, "{xff:?}");
    }
    let r = raw_request("10.0.0.1:1", "x-forwarded-for", &[b"1.2.3.4\xff"]);
    assert_eq!(key_bytes(&proxies(), &r).unwrap(), b"?1.2.3.4\xff");
    assert_eq!(proxies().client_ip(&RequestHead::new(&r)), None);
    assert_eq!(
        proxies().client(&RequestHead::new(&r)),
        Some(ClientAddr::Opaque(b"1.2.3.4\xff"))
    );
    // A huge garbage hop is a bounded key.
    let huge = vec![b'x'; 100_000];
    let r = raw_request("10.0.0.1:1", "x-forwarded-for", &[&huge]);
    let k = key_bytes(&proxies(), &r).unwrap();
    assert_eq!(k.len(), 33);
    assert_eq!(k[0], b'#');
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
    for (value, want) in [
        ("for=unknown", "?unknown"),
        ("for=\"unknown\"", "?unknown"),
        ("for=_hidden, for=10.0.0.5", "?_hidden"),
        ("for=\"_hidden:_port\"", "?_hidden:_port"),
        // An element without `for`: the proxy did not say; not its address.
        ("proto=https", "?"),
        // Commas and semicolons inside quotes split nothing.
        ("for=6.6.6.6, for=203.0.113.9;host=\"a,b\"", "203.0.113.9"),
        (
            "for=6.6.6.6, for=203.0.113.9;host=\"a;for=7.7.7.7,x\"",
            "203.0.113.9",
        ),
        ("for=203.0.113.9:4711;by=\"[fd00::1]\"", "203.0.113.9"),
        ("for=\"[2001:db8::1]:_obf\"", "2001:db8::/56"),
        ("for=\"[fd00::3]\", for=10.0.0.9", "fd00::/56"),
        // A quote the client left open does not swallow what proxies appended.
        ("for=\"6.6.6.6, for=203.0.113.9", "203.0.113.9"),
        ("for=\"6.6.6.6\\\", for=203.0.113.9", "203.0.113.9"),
    ] {
        let r = request("10.0.0.1:1", &[("forwarded", value)]);
        assert_eq!(key_of(&ip, &r).unwrap(), want, "{value}");
    }
}

#[test]
fn xff_hops_with_ports() {
    for (xff, want) in [
        ("6.6.6.6, 203.0.113.9:5678", "203.0.113.9"),
        ("[2001:db8::1]:80, 10.0.0.2:443", "2001:db8::/56"),
        ("[::1]:80", "::/56"),
        ("[fd00::1]:80, 10.0.0.2", "fd00::/56"),
        ("\"203.0.113.9\"", "203.0.113.9"),
        ("203.0.113.9:99999", "?203.0.113.9:99999"),
    ] {
        let r = request("10.0.0.1:1", &[("x-forwarded-for", xff)]);
        assert_eq!(key_of(&proxies(), &r).unwrap(), want, "{xff:?}");
    }
}

/// Bytes that are not ASCII (invalid UTF-8, obs-text, valid UTF-8 that only
/// looks like digits) in every position of every forwarding header: they
/// spoil their own hop and nothing else, and never make the proxy the key.
#[test]
fn non_ascii_bytes_spoil_only_their_own_hop() {
    let garbage: [&[u8]; 5] = [
        b"\xff",
        b"\x80\xfe",
        "é".as_bytes(),
        "１.２.３.４".as_bytes(),
        b"1.2.3.4 \xa0",
    ];
    let client = &b"203.0.113.9"[..];
    let trusted = &b"10.0.0.7"[..];
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let ip = proxies().header(header);
        let (name, quoted) = match header {
            ForwardedHeader::XForwardedFor => ("x-forwarded-for", false),
            _ => ("forwarded", true),
        };
        let line = |hops: &[&[u8]]| -> Vec<u8> {
            let mut out = Vec::new();
            for (i, h) in hops.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                if quoted {
                    out.extend_from_slice(b"for=\"");
                    out.extend_from_slice(h);
                    out.push(b'"');
                } else {
                    out.extend_from_slice(h);
                }
            }
            out
        };
        let key = |lines: &[Vec<u8>]| {
            let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
            key_bytes(&ip, &raw_request("10.0.0.1:1", name, &lines)).unwrap()
        };
        for g in garbage {
            let opaque = [b"?", g].concat();
            let spoiled = [client, b" ", g].concat();
            let cases: [(Vec<Vec<u8>>, &[u8]); 9] = [
                // Leftmost, middle (client-written), nearest.
                (vec![line(&[g, client, trusted])], client),
                (
                    vec![line(&[b"6.6.6.6", g, b"7.7.7.7", client, trusted])],
                    client,
                ),
                (vec![line(&[b"6.6.6.6", client, trusted, g])], &opaque),
                (vec![line(&[client, g, trusted])], &opaque),
                (
                    vec![line(&[b"6.6.6.6", &spoiled, trusted])],
                    &[b"?", &spoiled[..]].concat(),
                ),
                // Several header lines: the last line is the nearest.
                (vec![line(&[g]), line(&[client, trusted])], client),
                (vec![line(&[g, b"6.6.6.6"]), line(&[client])], client),
                (vec![line(&[client]), line(&[g, trusted])], &opaque),
                (vec![line(&[client, trusted]), line(&[g])], &opaque),
            ];
            for (i, (lines, want)) in cases.iter().enumerate() {
                let k = key(lines);
                assert_eq!(k, *want, "{header:?} case {i} {g:?}");
                assert!(k != b"10.0.0.1" && k != trusted, "{header:?} case {i}");
            }
        }
    }
}

#[test]
fn embedded_ipv4_is_keyed_as_ipv4() {
    for (peer, want) in [
        ("[64:ff9b::192.0.2.1]:1", "192.0.2.1"),
        ("[64:ff9b::c000:201]:1", "192.0.2.1"),
        ("[64:ff9b:1::192.0.2.1]:1", "192.0.2.1"),
        ("[64:ff9b:1:abcd:1::192.0.2.1]:1", "192.0.2.1"),
        ("[::192.0.2.1]:1", "192.0.2.1"),
        ("[::0.0.0.2]:1", "0.0.0.2"),
        ("[::ffff:192.0.2.1]:1", "192.0.2.1"),
        ("[::ffff:0:192.0.2.1]:1", "192.0.2.1"),
        ("[::ffff:0:198.51.100.7]:1", "198.51.100.7"),
        ("[2002:c000:201:17::1]:1", "192.0.2.1"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]:1", "192.0.2.45"),
        ("192.0.2.1:1", "192.0.2.1"),
        // `::` and `::1` stay IPv6; neighbours of the prefixes too.
        ("[::]:1", "::/56"),
        ("[::1]:1", "::/56"),
        ("[64:ff9b::1:192.0.2.1]:1", "64:ff9b::/56"),
        ("[64:ff9b:2::192.0.2.1]:1", "64:ff9b:2::/56"),
        ("[65:ff9b::192.0.2.1]:1", "65:ff9b::/56"),
        ("[2001:db8::3fff:fdd2]:1", "2001:db8::/56"),
        ("[2001:1::3fff:fdd2]:1", "2001:1::/56"),
        ("[2003:c000:201::1]:1", "2003:c000:201::/56"),
    ] {
        let r = request(peer, &[]);
        assert_eq!(key_of(&PeerIp::new(), &r).unwrap(), want, "{peer}");
        assert_eq!(key_of(&ClientIp::new(), &r).unwrap(), want, "{peer}");
    }
    let no_grouping = PeerIp::new().ipv6_prefix(128);
    assert_eq!(
        key_of(&no_grouping, &request("[::1]:1", &[])).unwrap(),
        "::1"
    );
    assert_eq!(key_of(&no_grouping, &request("[::]:1", &[])).unwrap(), "::");
    // Two clients of one translator or relay are two buckets (the two
    // IPv4-translated clients of the attack run, two Teredo clients of one
    // Teredo server); one client over it and over IPv4 is one.
    let key = |peer: &str| key_of(&PeerIp::new(), &request(peer, &[])).unwrap();
    for [a, b, a4, b4] in [
        [
            "[64:ff9b::198.51.100.1]:1",
            "[64:ff9b::198.51.100.2]:1",
            "198.51.100.1:1",
            "198.51.100.2:1",
        ],
        [
            "[::ffff:0:192.0.2.1]:1",
            "[::ffff:0:198.51.100.7]:1",
            "192.0.2.1:1",
            "198.51.100.7:1",
        ],
        [
            "[2001:0:4136:e300:8000:63bf:3fff:fdd2]:1",
            "[2001:0:4136:e300:8000:63bf:34ff:fdd2]:1",
            "192.0.2.45:1",
            "203.0.2.45:1",
        ],
    ] {
        assert_ne!(key(a), key(b), "{a} {b}");
        assert_eq!(key(a), key(a4), "{a}");
        assert_eq!(key(b), key(b4), "{b}");
    }
    // Through forwarding headers too.
    for (hop, want) in [
        ("64:ff9b::203.0.113.9", "203.0.113.9"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]:443", "192.0.2.45"),
        ("2002:cb00:7109::1", "203.0.113.9"),
    ] {
        let r = request("10.0.0.1:1", &[("x-forwarded-for", hop)]);
        assert_eq!(key_of(&proxies(), &r).unwrap(), want, "{hop}");
    }
    // Trust is not extended to translated forms of a trusted IPv4 address:
    // the peer is keyed as 10.0.0.1 but its header is not believed.
    for peer in [
        "[64:ff9b::10.0.0.1]:1",
        "[::ffff:0:10.0.0.1]:1",
        "[2002:a00:1::1]:1",
        "[2001::f5ff:fffe]:1",
    ] {
        let r = request(peer, &[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(key_of(&proxies(), &r).unwrap(), "10.0.0.1", "{peer}");
    }
    let r = request("[::ffff:10.0.0.1]:1", &[("x-forwarded-for", "1.1.1.1")]);
    assert_eq!(key_of(&proxies(), &r).unwrap(), "1.1.1.1");
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
