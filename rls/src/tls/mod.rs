//! gRPC over TLS (`GRPC_SERVER_USE_TLS`), as upstream serves it:
//!
//! * the server presents `GRPC_SERVER_TLS_CERT` / `GRPC_SERVER_TLS_KEY`
//!   (PEM), with ALPN `h2`;
//! * with `GRPC_CLIENT_TLS_CACERT`, every client must present a
//!   certificate that CA issued, valid for client authentication; without
//!   it no certificate is asked for;
//! * with `GRPC_CLIENT_TLS_SAN` too, that certificate must be valid for the
//!   name (`san`);
//! * the files are read again when they change (upstream reloads the
//!   certificate and key when their directory changes): here all three are
//!   polled every `RLS_RELOAD_INTERVAL`, and a new set is put in force for
//!   new connections if it loads; if not, the error is logged and the old
//!   set stays, as upstream keeps its old certificate.
//!
//! Upstream verifies client certificates against the system's roots plus
//! the CA file; here only the CA file is trusted.

mod incoming;
mod san;

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

use crate::settings::GrpcTls;

pub use incoming::incoming;

/// Why the TLS files cannot be used: the variable, the file and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

/// The bytes of the three files, to see when they change.
#[derive(PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

/// The TLS configuration in force for new gRPC connections, and where it
/// comes from.
pub struct ServerTls {
    settings: GrpcTls,
    current: ArcSwap<ServerConfig>,
    seen: Mutex<Files>,
}

fn read(name: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path)
        .map_err(|e| TlsError(format!("{name}: cannot read {}: {e}", path.display())))
}

fn read_all(s: &GrpcTls) -> Result<Files, TlsError> {
    Ok(Files {
        cert: read("GRPC_SERVER_TLS_CERT", &s.cert)?,
        key: read("GRPC_SERVER_TLS_KEY", &s.key)?,
        ca: match &s.client_ca {
            Some(ca) => Some(read("GRPC_CLIENT_TLS_CACERT", ca)?),
            None => None,
        },
    })
}

fn certificates(
    name: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |why: String| TlsError(format!("{name}: {}: {why}", path.display()));
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block in it".into()));
    }
    Ok(certs)
}

fn build(s: &GrpcTls, files: &Files) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("GRPC_SERVER_TLS_CERT", &s.cert, &files.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|e| {
        TlsError(format!(
            "GRPC_SERVER_TLS_KEY: {}: no private key in it: {e}",
            s.key.display()
        ))
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("GRPC_SERVER_USE_TLS: {e}")))?;
    let builder = match (&s.client_ca, &files.ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates("GRPC_CLIENT_TLS_CACERT", path, pem)? {
                roots.add(cert).map_err(|e| {
                    TlsError(format!("GRPC_CLIENT_TLS_CACERT: {}: {e}", path.display()))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| {
                    TlsError(format!("GRPC_CLIENT_TLS_CACERT: {}: {e}", path.display()))
                })?;
            let verifier = match &s.client_san {
                Some(san) => {
                    let name = ServerName::try_from(san.clone())
                        .map_err(|e| TlsError(format!("GRPC_CLIENT_TLS_SAN: {san:?}: {e}")))?;
                    Arc::new(san::SanVerifier::new(verifier, name))
                }
                None => verifier,
            };
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        TlsError(format!(
            "GRPC_SERVER_TLS_KEY: {} does not go with the certificate {}: {e}",
            s.key.display(),
            s.cert.display()
        ))
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl ServerTls {
    /// Reads the files: an error names the variable and the file.
    pub fn load(settings: &GrpcTls) -> Result<Arc<ServerTls>, TlsError> {
        let files = read_all(settings)?;
        let config = build(settings, &files)?;
        Ok(Arc::new(ServerTls {
            settings: settings.clone(),
            current: ArcSwap::from_pointee(config),
            seen: Mutex::new(files),
        }))
    }

    /// The configuration for the next connection.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.load_full()
    }

    /// Reads the files again: `None` when they did not change; otherwise
    /// whether the new set is in force (if not, the old one stays).
    pub fn check(&self) -> Option<Result<(), TlsError>> {
        let files = read_all(&self.settings);
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let files = match files {
            Ok(f) if f == *seen => return None,
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        let result = build(&self.settings, &files).map(|config| {
            self.current.store(Arc::new(config));
        });
        // A set that fails is not tried again until a file changes.
        *seen = files;
        Some(result)
    }

    /// Checks every `every`, forever, logging what changed.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: Option<TlsError> = None;
        loop {
            tick.tick().await;
            match self.check() {
                None => {}
                Some(Ok(())) => {
                    failing = None;
                    tracing::info!(
                        cert = %self.settings.cert.display(),
                        "gRPC TLS: the changed certificate files are in force for new connections"
                    );
                }
                Some(Err(e)) => {
                    if failing.as_ref() != Some(&e) {
                        tracing::error!(error = %e,
                            "gRPC TLS: the changed files cannot be used; the previous certificate stays in force");
                    }
                    failing = Some(e);
                }
            }
        }
    }

    /// What clients must show, for the start-up line.
    pub fn describe(&self) -> String {
        let s = &self.settings;
        match (&s.client_ca, &s.client_san) {
            (None, _) => "TLS, no client certificate asked for".into(),
            (Some(ca), None) => format!(
                "TLS, client certificates required, issued by {}",
                ca.display()
            ),
            (Some(ca), Some(san)) => format!(
                "TLS, client certificates required, issued by {} and valid for {san}",
                ca.display()
            ),
        }
    }
}
