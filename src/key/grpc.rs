//! Keys for gRPC calls: the method, and tonic's peer address.

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// The gRPC method of a call, from its path: `/package.Service/Method`
/// ([`GrpcMethod::full`]) or `/package.Service` ([`GrpcMethod::service`]).
///
/// A path that is not of that form (`/` and two non-empty segments) is a
/// missing key. Paths are chosen by clients: unknown methods get their own
/// bucket (tonic answers them `UNIMPLEMENTED`), so combine this with a
/// client key rather than using it alone on an open port.
///
/// Metadata are headers: [`HeaderKey`](crate::key::HeaderKey) keys a call by
/// `x-user-id`, `HeaderKey::new(AUTHORIZATION).hashed()` by a credential of
/// any scheme, and [`BearerToken`](crate::key::BearerToken) by a bearer token.
///
/// ```
/// use tower_throttle::key::{GrpcMethod, KeyExtractor, KeyWriter, RequestHead};
///
/// let req = http::Request::builder().uri("/grpc.health.v1.Health/Check").body(())?;
/// let mut key = Vec::new();
/// GrpcMethod::service().extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key, b"/grpc.health.v1.Health");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcMethod {
    method: bool,
}

impl GrpcMethod {
    /// `/package.Service/Method`: one bucket per method.
    pub const fn full() -> Self {
        GrpcMethod { method: true }
    }

    /// `/package.Service`: one bucket per service.
    pub const fn service() -> Self {
        GrpcMethod { method: false }
    }
}

impl Default for GrpcMethod {
    fn default() -> Self {
        Self::full()
    }
}

const NOT_GRPC: MissingKey =
    MissingKey::new("the path is not a gRPC method (/package.Service/Method)");

impl KeyExtractor for GrpcMethod {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let path = req.uri().path();
        let (service, method) = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .ok_or(NOT_GRPC)?;
        if service.is_empty() || method.is_empty() || method.contains('/') {
            return Err(NOT_GRPC);
        }
        let end = if self.method {
            path.len()
        } else {
            1 + service.len()
        };
        key.push(&path.as_bytes()[..end]);
        Ok(())
    }

    fn per_client(&self) -> bool {
        false
    }
}

/// The peer address tonic's server recorded: `TcpConnectInfo`, or with
/// `grpc-tls` the TCP info inside `TlsConnectInfo`.
#[cfg(feature = "grpc")]
pub(crate) fn tonic_peer_ip(ext: &http::Extensions) -> Option<std::net::IpAddr> {
    use tonic::transport::server::TcpConnectInfo;
    let addr = ext
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr);
    #[cfg(feature = "grpc-tls")]
    let addr = addr.or_else(|| {
        ext.get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.get_ref().remote_addr())
    });
    addr.map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(x: GrpcMethod, uri: &str) -> Result<String, MissingKey> {
        let req = http::Request::builder().uri(uri).body(()).unwrap();
        let mut buf = Vec::new();
        x.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut buf))?;
        Ok(String::from_utf8(buf).unwrap())
    }

    #[test]
    fn methods_and_services() {
        let m = "/grpc.health.v1.Health/Watch";
        assert_eq!(key(GrpcMethod::full(), m).unwrap(), m);
        assert_eq!(
            key(GrpcMethod::service(), m).unwrap(),
            "/grpc.health.v1.Health"
        );
        for bad in ["/", "/a", "/a/", "//b", "/a/b/c"] {
            assert_eq!(key(GrpcMethod::full(), bad), Err(NOT_GRPC), "{bad}");
        }
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn tonic_tcp_connect_info_is_the_peer() {
        let mut ext = http::Extensions::new();
        assert_eq!(tonic_peer_ip(&ext), None);
        ext.insert(tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some("[::ffff:198.51.100.7]:50051".parse().unwrap()),
        });
        assert_eq!(
            tonic_peer_ip(&ext),
            Some("::ffff:198.51.100.7".parse().unwrap())
        );
    }
}
