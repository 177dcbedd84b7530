//! `GRPC_SERVER_USE_TLS` and its files, as upstream reads them
//! (`src/settings/settings.go` `GrpcServerTlsConfig`, `src/server/tls.go`).

use std::path::PathBuf;

use super::{Env, SettingsError};

/// TLS on the gRPC listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcTls {
    /// `GRPC_SERVER_TLS_CERT`: the server's PEM certificate chain.
    pub cert: PathBuf,
    /// `GRPC_SERVER_TLS_KEY`: its PEM private key.
    pub key: PathBuf,
    /// `GRPC_CLIENT_TLS_CACERT`: when set, clients must present a
    /// certificate this CA issued (upstream's `RequireAndVerifyClientCert`).
    pub client_ca: Option<PathBuf>,
    /// `GRPC_CLIENT_TLS_SAN`: a DNS name or IP address the client
    /// certificate must hold among its subject alternative names.
    pub client_san: Option<String>,
}

pub(super) fn grpc_tls(env: &Env<'_>) -> Result<Option<GrpcTls>, SettingsError> {
    let path = |name: &str| (env.0)(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    let client_ca = path("GRPC_CLIENT_TLS_CACERT");
    let client_san = (env.0)("GRPC_CLIENT_TLS_SAN").filter(|s| !s.is_empty());
    if !env.flag("GRPC_SERVER_USE_TLS", false)? {
        // Upstream reads none of them then; the start-up notices say so.
        return Ok(None);
    }
    let required = |name: &'static str| {
        path(name).ok_or_else(|| SettingsError {
            name,
            message: "a PEM file is required with GRPC_SERVER_USE_TLS=true".into(),
        })
    };
    let (cert, key) = (
        required("GRPC_SERVER_TLS_CERT")?,
        required("GRPC_SERVER_TLS_KEY")?,
    );
    if let Some(san) = &client_san {
        if client_ca.is_none() {
            // Upstream checks the SAN only on verified client chains, and
            // there are none without a client CA: the check would never run.
            return Err(SettingsError {
                name: "GRPC_CLIENT_TLS_SAN",
                message: "needs GRPC_CLIENT_TLS_CACERT: without a client CA no client \
                          certificate is asked for, so the SAN could never be checked"
                    .into(),
            });
        }
        if rustls::pki_types::ServerName::try_from(san.as_str()).is_err() {
            return Err(SettingsError::invalid(
                "GRPC_CLIENT_TLS_SAN",
                san,
                "expected a DNS name or an IP address (compared with the client \
                 certificate's DNS and IP subject alternative names)",
            ));
        }
    }
    Ok(Some(GrpcTls {
        cert,
        key,
        client_ca,
        client_san,
    }))
}
