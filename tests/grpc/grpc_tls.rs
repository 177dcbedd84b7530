//! gRPC over TLS: a tonic client against a tonic server with a certificate
//! from a test CA, behind `ThrottleLayer` keyed by the default `PeerIp`
//! (feature `grpc-tls`). tonic 0.14 records a TLS peer twice, as
//! `TcpConnectInfo` and as `TlsConnectInfo<TcpConnectInfo>`; the test also
//! runs with the first removed, so the layer must read the second.

use crate::pki;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use pki::Pki;
use tokio::net::TcpListener;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower_throttle::clock::ManualClock;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

async fn connect(addr: SocketAddr, from: IpAddr, ca: &[u8]) -> HealthClient<Channel> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .local_address(Some(from))
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

#[tokio::test]
async fn peer_ip_keys_tls_clients_by_their_address() {
    let pki = Pki::new();
    limits_each_client(&pki, false).await;
    limits_each_client(&pki, true).await;
}

/// Serves the health service over TLS behind the layer (after removing
/// `TcpConnectInfo` from each request if `tls_info_only`); two clients from
/// two loopback addresses get one call a minute each.
async fn limits_each_client(pki: &Pki, tls_info_only: bool) {
    // A clock that stands still: a minute boundary between a client's two
    // calls would open a new window and admit the second.
    let layer = ThrottleLayer::new(
        MemoryStore::builder().clock(ManualClock::new()).build(),
        Policy::fixed_window(1, Duration::from_secs(60)).unwrap(),
    );
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let identity = Identity::from_pem(pki.read("server.crt"), pki.read("server.key"));
    let strip = tower::util::MapRequestLayer::new(move |mut req: http::Request<_>| {
        if tls_info_only {
            req.extensions_mut().remove::<TcpConnectInfo>();
        }
        req
    });
    tokio::spawn(
        Server::builder()
            .tls_config(ServerTlsConfig::new().identity(identity))
            .unwrap()
            .layer(strip)
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let ca = pki.read("ca.crt");
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    for from in ["127.0.0.1", "127.0.0.2"] {
        let mut client = connect(addr, from.parse().unwrap(), &ca).await;
        client.check(check()).await.unwrap();
        let status = client.check(check()).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    }
}
