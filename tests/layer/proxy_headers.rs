//! `ClientIp` against the header sets real proxies send, written as they
//! appear on the wire, each citing the product's documentation.

use std::net::SocketAddr;

use tower_throttle::key::{
    Cidr, ClientAddr, ClientIp, ForwardedHeader, KeyExtractor, KeyWriter, RequestHead,
};

use crate::warns::warnings_during;

/// Parses a raw HTTP/1.1 request head into a request from `peer`.
fn wire(peer: &str, head: &str) -> http::Request<()> {
    let mut lines = head.trim_start().split("\r\n");
    let request_line = lines.next().unwrap();
    let target = request_line.split(' ').nth(1).unwrap();
    let mut b = http::Request::builder().uri(target);
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').unwrap();
        b = b.header(name, value.trim());
    }
    let mut req = b.body(()).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

fn key(ip: &ClientIp, req: &http::Request<()>) -> String {
    let mut buf = Vec::new();
    ip.extract(&RequestHead::new(req), &mut KeyWriter::new(&mut buf))
        .unwrap();
    String::from_utf8(buf).unwrap()
}

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

/// nginx in front at 10.0.0.2, configured as its docs suggest
/// (https://nginx.org/en/docs/http/ngx_http_proxy_module.html#proxy_set_header,
/// `$proxy_add_x_forwarded_for`: "the X-Forwarded-For client request header
/// field with the $remote_addr variable appended to it"):
///
/// ```nginx
/// proxy_set_header Host $host;
/// proxy_set_header X-Real-IP $remote_addr;
/// proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
/// proxy_set_header X-Forwarded-Proto $scheme;
/// ```
///
/// The client 203.0.113.7 sent its own `X-Forwarded-For: 6.6.6.6` and
/// `X-Real-IP: 6.6.6.6`: nginx appends to the first and replaces the second.
const NGINX: &str = "GET /api/items HTTP/1.0\r
Host: app.example.com\r
X-Real-IP: 203.0.113.7\r
X-Forwarded-For: 6.6.6.6, 203.0.113.7\r
X-Forwarded-Proto: https\r
Connection: close\r
User-Agent: curl/8.5.0\r
Accept: */*\r
\r
";

#[test]
fn nginx_x_real_ip_and_x_forwarded_for() {
    let req = wire("10.0.0.2:41822", NGINX);
    let xff = ClientIp::new().trust(cidr("10.0.0.0/8"));
    assert_eq!(key(&xff, &req), "203.0.113.7");
    let real_ip = xff.clone().header(ForwardedHeader::XRealIp);
    assert_eq!(key(&real_ip, &req), "203.0.113.7");
    // The same headers sent straight to the app by the client are ignored.
    let direct = wire("203.0.113.7:5000", NGINX);
    assert_eq!(key(&real_ip, &direct), "203.0.113.7");
    let spoofer = wire("198.51.100.9:5000", NGINX);
    assert_eq!(key(&real_ip, &spoofer), "198.51.100.9");
    assert_eq!(key(&xff, &spoofer), "198.51.100.9");
}

/// Caddy ≥ 2.5 `reverse_proxy` at 10.0.0.3 with no `trusted_proxies`
/// (https://caddyserver.com/docs/caddyfile/directives/reverse_proxy#defaults):
/// it sets `X-Forwarded-For` to the client, ignoring what an untrusted
/// client sent, and adds `X-Forwarded-Proto` and `X-Forwarded-Host`. The
/// client is IPv6; Caddy writes it bare.
const CADDY: &str = "GET /feed HTTP/1.1\r
Host: app.internal:8080\r
User-Agent: Mozilla/5.0\r
Accept-Encoding: gzip\r
X-Forwarded-For: 2001:db8:85a3:12:8a2e:370:7334:1\r
X-Forwarded-Host: app.example.com\r
X-Forwarded-Proto: https\r
\r
";

#[test]
fn caddy_bare_ipv6_is_grouped() {
    let req = wire("10.0.0.3:50312", CADDY);
    let ip = ClientIp::new().trust(cidr("10.0.0.3"));
    assert_eq!(key(&ip, &req), "2001:db8:85a3::/56");
    assert_eq!(
        key(&ip.clone().ipv6_prefix(128), &req),
        "2001:db8:85a3:12:8a2e:370:7334:1"
    );
    let addr = ip.client(&RequestHead::new(&req));
    assert_eq!(
        addr,
        Some(ClientAddr::Ip(
            "2001:db8:85a3:12:8a2e:370:7334:1".parse().unwrap()
        ))
    );
}

/// Cloudflare's published ranges (https://www.cloudflare.com/ips-v4/,
/// https://www.cloudflare.com/ips-v6/), held as `ipnet` values.
const CLOUDFLARE: &[&str] = &[
    "173.245.48.0/20",
    "103.21.244.0/22",
    "103.22.200.0/22",
    "103.31.4.0/22",
    "141.101.64.0/18",
    "108.162.192.0/18",
    "190.93.240.0/20",
    "188.114.96.0/20",
    "197.234.240.0/22",
    "198.41.128.0/17",
    "162.158.0.0/15",
    "104.16.0.0/13",
    "104.24.0.0/14",
    "172.64.0.0/13",
    "131.0.72.0/22",
    "2400:cb00::/32",
    "2606:4700::/32",
    "2803:f800::/32",
    "2405:b500::/32",
    "2405:8100::/32",
    "2a06:98c0::/29",
    "2c0f:f248::/32",
];

/// Cloudflare to the origin
/// (https://developers.cloudflare.com/fundamentals/reference/http-headers/):
/// `CF-Connecting-IP` is the client; `X-Forwarded-For` gets the client
/// appended to what the client sent; `True-Client-IP` (Enterprise) equals
/// `CF-Connecting-IP`; `CF-IPCountry`, `CF-Ray`, `CF-Visitor` too.
const CLOUDFLARE_REQUEST: &str = "POST /comments HTTP/1.1\r
Host: example.com\r
Accept-Encoding: gzip, br\r
CF-Connecting-IP: 198.51.100.23\r
CF-IPCountry: NL\r
CF-Ray: 8a1b2c3d4e5f6789-AMS\r
CF-Visitor: {\"scheme\":\"https\"}\r
True-Client-IP: 198.51.100.23\r
X-Forwarded-For: 6.6.6.6, 198.51.100.23\r
X-Forwarded-Proto: https\r
Content-Type: application/json\r
Content-Length: 17\r
\r
";

#[test]
fn cloudflare_connecting_ip_from_its_ranges_only() {
    let ranges: Vec<ipnet::IpNet> = CLOUDFLARE.iter().map(|r| r.parse().unwrap()).collect();
    let cf = ClientIp::new().trust_all(ranges.iter().copied().map(Cidr::from));
    let req = wire("162.158.90.12:33110", CLOUDFLARE_REQUEST);
    for header in [
        ForwardedHeader::CfConnectingIp,
        ForwardedHeader::TrueClientIp,
        ForwardedHeader::XForwardedFor,
    ] {
        assert_eq!(
            key(&cf.clone().header(header), &req),
            "198.51.100.23",
            "{header:?}"
        );
    }
    // Over IPv6 from Cloudflare: the same.
    let v6 = wire("[2606:4700:10::6816:1]:33110", CLOUDFLARE_REQUEST);
    assert_eq!(
        key(&cf.clone().header(ForwardedHeader::CfConnectingIp), &v6),
        "198.51.100.23"
    );
    // Anyone else sending Cloudflare's headers is keyed by its own address.
    let direct = wire("192.0.2.200:1234", CLOUDFLARE_REQUEST);
    assert_eq!(
        key(&cf.clone().header(ForwardedHeader::CfConnectingIp), &direct),
        "192.0.2.200"
    );
}

/// AWS Application Load Balancer in VPC 10.1.0.0/16
/// (https://docs.aws.amazon.com/elasticloadbalancing/latest/application/x-forwarded-headers.html):
/// `X-Forwarded-For` has the client appended (an IPv6 client bare, as in the
/// docs' `2001:DB8::21f:5bff:febf:ce22:8a2e`), plus `X-Forwarded-Port`,
/// `X-Forwarded-Proto` and `X-Amzn-Trace-Id`.
const ALB_V6: &str = "GET /health HTTP/1.1\r
X-Forwarded-For: 2001:DB8::21f:5bff:febf:ce22:8a2e\r
X-Forwarded-Proto: https\r
X-Forwarded-Port: 443\r
Host: my-alb-123456.us-east-1.elb.amazonaws.com\r
X-Amzn-Trace-Id: Root=1-67891233-abcdef012345678912345678\r
User-Agent: curl/8.5.0\r
\r
";
const ALB_APPENDED: &str = "GET / HTTP/1.1\r
X-Forwarded-For: 127.0.0.1, 203.0.113.40\r
X-Forwarded-Proto: http\r
X-Forwarded-Port: 80\r
Host: my-alb-123456.us-east-1.elb.amazonaws.com\r
\r
";

#[test]
fn aws_alb_appends_and_writes_ipv6_bare() {
    let alb = ClientIp::new().trust(cidr("10.1.0.0/16"));
    // `2001:DB8::21f:…` has one zero group: 2001:db8:0:21f:…, so its /56 is 2001:db8:0:200::/56.
    assert_eq!(
        key(&alb, &wire("10.1.3.17:40000", ALB_V6)),
        "2001:db8:0:200::/56"
    );
    assert_eq!(
        key(&alb, &wire("10.1.3.17:40000", ALB_APPENDED)),
        "203.0.113.40"
    );
}

/// RFC 7239 §4's own examples, with the quoted, bracketed IPv6 and port.
#[test]
fn rfc7239_forwarded() {
    let ip = ClientIp::new()
        .trust(cidr("10.0.0.0/8"))
        .header(ForwardedHeader::Forwarded)
        .ipv6_prefix(128);
    let req = wire(
        "10.0.0.1:1",
        "GET / HTTP/1.1\r\nForwarded: for=192.0.2.43, For=\"[2001:db8:cafe::17]:4711\"\r\n\r\n",
    );
    assert_eq!(key(&ip, &req), "2001:db8:cafe::17");
    let req = wire(
        "10.0.0.1:1",
        "GET / HTTP/1.1\r\nForwarded: for=192.0.2.60;proto=http;by=203.0.113.43\r\n\r\n",
    );
    assert_eq!(key(&ip, &req), "192.0.2.60");
    // An IPv4-mapped client is its IPv4 address.
    let req = wire(
        "10.0.0.1:1",
        "GET / HTTP/1.1\r\nForwarded: for=\"[::ffff:192.0.2.9]:80\"\r\n\r\n",
    );
    assert_eq!(key(&ip, &req), "192.0.2.9");
}

#[test]
fn forwarding_headers_with_no_trusted_proxy_warn_once() {
    let ip = ClientIp::new();
    let warned = warnings_during(|| {
        for _ in 0..100 {
            // Behind nginx, but nginx is not trusted: every client is nginx.
            assert_eq!(key(&ip.clone(), &wire("10.0.0.2:1", NGINX)), "10.0.0.2");
        }
    });
    assert_eq!(warned, 1);
    // No forwarding header, nothing to say.
    let quiet = ClientIp::new();
    let req = wire("10.0.0.2:1", "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(
        warnings_during(|| {
            key(&quiet, &req);
        }),
        0
    );
}

#[test]
fn a_trusted_proxy_sending_another_header_warns_once() {
    // Configured for X-Real-IP, but the ALB sends only X-Forwarded-For.
    let ip = ClientIp::new()
        .trust(cidr("10.1.0.0/16"))
        .header(ForwardedHeader::XRealIp);
    let warned = warnings_during(|| {
        for _ in 0..10 {
            assert_eq!(key(&ip, &wire("10.1.3.17:1", ALB_APPENDED)), "10.1.3.17");
        }
    });
    assert_eq!(warned, 1);
    // Configured right, no warning.
    let ok = ClientIp::new().trust(cidr("10.1.0.0/16"));
    assert_eq!(
        warnings_during(|| {
            key(&ok, &wire("10.1.3.17:1", ALB_APPENDED));
        }),
        0
    );
}

#[test]
fn trusting_everything_warns_when_configured() {
    assert_eq!(
        warnings_during(|| {
            let _ = ClientIp::new().trust(cidr("0.0.0.0/0"));
        }),
        1
    );
    assert_eq!(
        warnings_during(|| {
            let _ = ClientIp::new().trust(cidr("::/0"));
        }),
        1
    );
    assert_eq!(
        warnings_during(|| {
            let _ = ClientIp::new().trust(cidr("10.0.0.0/8"));
        }),
        0
    );
    // What trusting everything means: the client's own leftmost entry wins.
    let all = ClientIp::new().trust(cidr("0.0.0.0/0"));
    assert_eq!(key(&all, &wire("203.0.113.7:1", NGINX)), "6.6.6.6");
}

#[test]
fn single_address_headers_take_the_nearest_line_and_never_the_proxy() {
    let ip = ClientIp::new()
        .trust(cidr("10.0.0.0/8"))
        .header(ForwardedHeader::FlyClientIp);
    let mut req = wire(
        "10.0.0.9:1",
        "GET / HTTP/1.1\r\nFly-Client-IP: 6.6.6.6\r\n\r\n",
    );
    req.headers_mut()
        .append("fly-client-ip", "[2001:db8::5]:443".parse().unwrap());
    assert_eq!(key(&ip.clone().ipv6_prefix(128), &req), "2001:db8::5");
    let garbage = wire(
        "10.0.0.9:1",
        "GET / HTTP/1.1\r\nFly-Client-IP: 1.2.3.4, 5.6.7.8\r\n\r\n",
    );
    assert_eq!(
        ip.client(&RequestHead::new(&garbage)),
        Some(ClientAddr::Opaque(b"1.2.3.4, 5.6.7.8"))
    );
    let fastly = ClientIp::new()
        .trust(cidr("10.0.0.0/8"))
        .header(ForwardedHeader::FastlyClientIp);
    let req = wire(
        "10.0.0.9:1",
        "GET / HTTP/1.1\r\nFastly-Client-IP: ::ffff:192.0.2.1\r\n\r\n",
    );
    assert_eq!(key(&fastly, &req), "192.0.2.1");
}

#[test]
fn cidr_and_ipnet_convert_both_ways() {
    for s in [
        "10.0.0.0/8",
        "192.0.2.1/32",
        "2001:db8::/32",
        "::/0",
        "0.0.0.0/0",
    ] {
        let net: ipnet::IpNet = s.parse().unwrap();
        let c = Cidr::from(net);
        assert_eq!(c, cidr(s));
        assert_eq!(ipnet::IpNet::from(c), net);
        assert_eq!(c.to_string(), s);
    }
    // Host bits are cleared as `ipnet`'s `trunc` does.
    let net: ipnet::IpNet = "10.1.2.3/8".parse().unwrap();
    assert_eq!(ipnet::IpNet::from(Cidr::from(net)), net.trunc());
    // An IPv4-mapped range is its IPv4 range.
    let mapped: ipnet::Ipv6Net = "::ffff:10.0.0.0/104".parse().unwrap();
    assert_eq!(Cidr::from(mapped), cidr("10.0.0.0/8"));
    assert_eq!(cidr("::ffff:192.0.2.1"), cidr("192.0.2.1"));
    assert!(cidr("::/0").contains("::ffff:1.2.3.4".parse().unwrap()));
    assert!(!cidr("2001:db8::/32").contains("1.2.3.4".parse().unwrap()));
}
