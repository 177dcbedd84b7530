//! Clients behind IPv6 transition addresses (Teredo, 6to4, NAT64,
//! IPv4-translated) through the layer: one bucket per IPv4 client, the one
//! it has over plain IPv4, whichever key extractor found the address.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::key::{ClientIp, ForwardedHeader, KeyExtractor, PeerIp};
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

/// One request a minute per key, on a clock that stands still (a minute
/// boundary mid-test would admit the requests asserted limited).
fn limited(
    key: impl KeyExtractor,
) -> impl Service<Request<()>, Response = Response<impl Sized>, Error = Infallible> + Clone {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    ServiceBuilder::new()
        .layer(
            ThrottleLayer::new(
                MemoryStore::builder().clock(ManualClock::new()).build(),
                policy,
            )
            .key(key),
        )
        .service(tower::service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        }))
}

fn request(peer: &str, header: Option<(&str, &str)>) -> Request<()> {
    let mut req = Request::new(());
    if let Some((name, value)) = header {
        req.headers_mut().insert(
            name.parse::<http::HeaderName>().unwrap(),
            value.parse().unwrap(),
        );
    }
    req.extensions_mut()
        .insert(peer.parse::<SocketAddr>().unwrap());
    req
}

async fn status<S, B>(svc: &S, req: Request<()>) -> StatusCode
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Clone,
{
    svc.clone().oneshot(req).await.unwrap().status()
}

/// Teredo (RFC 4380): `2001:0::/32`, server IPv4, flags, port, then the
/// client's public IPv4 address with every bit inverted.
const TEREDO_A: &str = "2001:0:4136:e300:8000:63bf:3fff:fdd2"; // 192.0.2.45
const TEREDO_A_AGAIN: &str = "2001:0:4136:e378:0:9c3f:3fff:fdd2"; // new server, flags, port
const TEREDO_B: &str = "2001:0:4136:e300:8000:63bf:34ff:fdd2"; // 203.0.2.45

#[tokio::test]
async fn two_teredo_clients_of_one_server_are_two_buckets() {
    let svc = limited(PeerIp::new());
    let peer = |ip: &str| request(&format!("[{ip}]:40000"), None);
    assert_eq!(status(&svc, peer(TEREDO_A)).await, StatusCode::OK);
    assert_eq!(status(&svc, peer(TEREDO_B)).await, StatusCode::OK);
    // Before, both were `2001:0:4136:e300::/56`: B was refused. A client
    // cannot reset its quota by changing server, flags or port, nor by
    // coming over plain IPv4.
    for again in [
        peer(TEREDO_A),
        peer(TEREDO_A_AGAIN),
        request("192.0.2.45:5000", None),
    ] {
        assert_eq!(status(&svc, again).await, StatusCode::TOO_MANY_REQUESTS);
    }
    // The documentation prefix is not Teredo: one /56, one bucket.
    assert_eq!(
        status(&svc, peer("2001:db8::3fff:fdd2")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&svc, peer("2001:db8::34ff:fdd2")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn other_transition_clients_are_keyed_by_their_ipv4_address() {
    let svc = limited(PeerIp::new());
    for (a, b, a4) in [
        // IPv4-translated (RFC 2765): the pair an attack run found sharing `::/56`.
        ("::ffff:0:192.0.2.1", "::ffff:0:198.51.100.7", "192.0.2.1"),
        // 6to4 (RFC 3056): `2002:V4ADDR::/48`.
        ("2002:cb00:7107:1::1", "2002:cb00:7108:1::1", "203.0.113.7"),
        // NAT64 (RFC 6052).
        (
            "64:ff9b::198.51.100.1",
            "64:ff9b::198.51.100.2",
            "198.51.100.1",
        ),
    ] {
        let peer = |ip: &str| request(&format!("[{ip}]:1"), None);
        assert_eq!(status(&svc, peer(a)).await, StatusCode::OK, "{a}");
        assert_eq!(status(&svc, peer(b)).await, StatusCode::OK, "{b}");
        let v4 = request(&format!("{a4}:1"), None);
        assert_eq!(
            status(&svc, v4).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{a4}"
        );
    }
}

/// Behind a trusted proxy, every header the proxy may write carries the
/// Teredo client to the same key as the peer address would.
#[tokio::test]
async fn teredo_clients_behind_a_trusted_proxy_are_two_buckets() {
    let proxy = ClientIp::new().trust("10.0.0.0/8".parse().unwrap());
    for (header, name, value) in [
        (
            ForwardedHeader::XForwardedFor,
            "x-forwarded-for",
            "6.6.6.6, {ip}",
        ),
        (ForwardedHeader::Forwarded, "forwarded", "for=\"{ip_port}\""),
        (ForwardedHeader::XRealIp, "x-real-ip", "{ip}"),
    ] {
        let svc = limited(proxy.clone().header(header));
        let via_proxy = |ip: &str| {
            // RFC 7239 brackets an IPv6 address that has a port.
            let ip_port = if ip.contains(':') {
                format!("[{ip}]:40000")
            } else {
                format!("{ip}:40000")
            };
            let value = value.replace("{ip_port}", &ip_port).replace("{ip}", ip);
            request("10.0.0.1:1", Some((name, &value)))
        };
        assert_eq!(status(&svc, via_proxy(TEREDO_A)).await, StatusCode::OK);
        assert_eq!(status(&svc, via_proxy(TEREDO_B)).await, StatusCode::OK);
        assert_eq!(
            status(&svc, via_proxy(TEREDO_A_AGAIN)).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{name}"
        );
        assert_eq!(
            status(&svc, via_proxy("192.0.2.45")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{name}"
        );
    }
}
