//! TLS (`rediss://`) for every Redis store, with feature `tls`: rustls with
//! the `ring` provider, the system's roots unless a CA is given.

use redis::{Client, IntoConnectionInfo, RedisResult};

use super::RedisStoreBuilder;

/// Certificates beyond the system's roots.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a private key.
        f.debug_struct("Tls")
            .field("root_cert", &self.root_cert.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    pub(crate) fn set_root_cert(&mut self, pem: Vec<u8>) {
        self.root_cert = Some(pem);
    }

    pub(crate) fn set_client_cert(&mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        self.client = Some((cert_pem, key_pem));
    }

    fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.root_cert.is_none() && self.client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self.client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.root_cert.clone(),
        })
    }

    /// A client for `info`, with these certificates when it is `rediss://`.
    pub(crate) fn client(&self, info: impl IntoConnectionInfo) -> RedisResult<Client> {
        install_provider();
        let info = info.into_connection_info()?;
        match (self.certificates(), info.addr()) {
            (Some(certs), redis::ConnectionAddr::TcpTls { .. }) => {
                Client::build_with_tls(info, certs)
            }
            _ => Client::open(info),
        }
    }

    /// A cluster client builder with these certificates.
    pub(crate) fn cluster(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        install_provider();
        match self.certificates() {
            Some(certs) => builder.certs(certs),
            None => builder,
        }
    }
}

/// rustls needs a process-wide crypto provider; installing one when the
/// application already did is not an error.
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl RedisStoreBuilder {
    /// Trusts the CA certificate(s) in `pem` for `rediss://` connections,
    /// instead of the system's roots (feature `tls`): a private CA, as
    /// managed services and self-hosted TLS use.
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.set_root_cert(pem.into());
        self
    }

    /// Authenticates this client with a certificate and its private key,
    /// both PEM, for servers that require client certificates
    /// (`tls-auth-clients yes`; feature `tls`).
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.set_client_cert(cert_pem.into(), key_pem.into());
        self
    }
}
