//! `CONFIG_TYPE=GRPC_XDS_SOTW` and its variables, with upstream's names and
//! defaults (envoyproxy/ratelimit `src/settings/settings.go`): the
//! configuration comes from an xDS management server (see [`crate::xds`]).
//! With `CONFIG_TYPE=FILE` (the default) none of them is read, as upstream.

use std::path::PathBuf;
use std::time::Duration;

use super::parse::duration_value;
use super::{Env, SettingsError};

/// Where the xDS server is and how to talk to it.
#[derive(Clone, Debug, PartialEq)]
pub struct XdsSettings {
    /// `CONFIG_GRPC_XDS_SERVER_URL` as written (default `localhost:18000`).
    pub server_url: String,
    /// Its host (brackets removed from an IPv6 address).
    pub host: String,
    /// Its port.
    pub port: u16,
    /// `CONFIG_GRPC_XDS_NODE_ID` (default `default`).
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`, split as upstream's code splits it:
    /// on `,`, then on the first `=`; an entry without `=` is skipped.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (default 3s): the
    /// pause (±50% jitter) between attempts to connect.
    pub connect_retry_interval: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k1:v1,k2:v2`), sent as
    /// gRPC metadata on the stream; names lower-cased as gRPC sends them.
    pub additional_headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS` (default false) and its files.
    pub tls: Option<XdsTls>,
    /// `XDS_CLIENT_BACKOFF_*`: the pause before connecting again after the
    /// stream is lost.
    pub backoff: XdsBackoff,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (default unset: gRPC's 4 MiB).
    pub max_msg_size: Option<usize>,
}

/// TLS to the xDS server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsTls {
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT` and `_KEY`: the client certificate
    /// shown to the server (both or neither).
    pub client: Option<(PathBuf, PathBuf)>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: roots trusted for the server's
    /// certificate, on top of the system's.
    pub ca: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the server's certificate
    /// must be valid for (default: the URL's host).
    pub san: Option<String>,
}

/// Upstream's `jpillora/backoff` settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct XdsBackoff {
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (default 10s).
    pub initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (default 60s).
    pub max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` (default 0.5): upstream passes it
    /// as the backoff's growth factor.
    pub factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER` (default true).
    pub jitter: bool,
}

/// The xDS variables, in the order a reader would look for them.
pub(super) const VARIABLES: &[&str] = &[
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
];

/// `CONFIG_TYPE`: `None` for `FILE`, the xDS settings for `GRPC_XDS_SOTW`;
/// anything else is refused.
pub(super) fn xds(env: &Env<'_>) -> Result<Option<XdsSettings>, SettingsError> {
    match env.string("CONFIG_TYPE", "FILE").as_str() {
        "FILE" => return Ok(None),
        "GRPC_XDS_SOTW" => {}
        other => {
            return Err(SettingsError::invalid(
                "CONFIG_TYPE",
                other,
                "expected FILE or GRPC_XDS_SOTW",
            ))
        }
    }
    let server_url = env.string("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000");
    let (host, port) = host_port(&server_url).ok_or_else(|| {
        SettingsError::invalid(
            "CONFIG_GRPC_XDS_SERVER_URL",
            &server_url,
            "expected host:port (a name, an IPv4 address or a [bracketed] IPv6 address)",
        )
    })?;
    let node_metadata = env
        .string("CONFIG_GRPC_XDS_NODE_METADATA", "")
        .split(',')
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let additional_headers = headers(&env.string("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", ""))?;
    let tls = tls(env, &host)?;
    let factor = match (env.0)("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        None => 0.5,
        Some(raw) => match raw.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f >= 0.0 => f,
            _ => {
                return Err(SettingsError::invalid(
                    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                    &raw,
                    "expected a number ≥ 0",
                ))
            }
        },
    };
    let max_msg_size = match (env.0)("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
        None => None,
        Some(raw) if raw.trim().is_empty() => None,
        Some(raw) => match raw.trim().parse::<u32>() {
            Ok(0) => None,
            Ok(n) if n <= i32::MAX as u32 => Some(n as usize),
            _ => {
                return Err(SettingsError::invalid(
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                    &raw,
                    "expected a whole number of bytes (0: gRPC's default of 4 MiB)",
                ))
            }
        },
    };
    Ok(Some(XdsSettings {
        server_url,
        host,
        port,
        node_id: env.string("CONFIG_GRPC_XDS_NODE_ID", "default"),
        node_metadata,
        connect_retry_interval: above_zero(
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            duration(
                env,
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
                Duration::from_secs(3),
            )?,
        )?,
        additional_headers,
        tls,
        backoff: XdsBackoff {
            initial: duration(
                env,
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                Duration::from_secs(10),
            )?,
            max: duration(
                env,
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
                Duration::from_secs(60),
            )?,
            factor,
            jitter: env.flag("XDS_CLIENT_BACKOFF_JITTER", true)?,
        },
        max_msg_size,
    }))
}

/// `d`, refused when zero: a retry without a pause spins while the
/// control plane refuses connections.
fn above_zero(name: &'static str, d: Duration) -> Result<Duration, SettingsError> {
    match d {
        Duration::ZERO => Err(SettingsError {
            name,
            message: "0 retries without a pause: give one above zero, such as 3s".to_owned(),
        }),
        d => Ok(d),
    }
}

/// As `envconfig` reads a duration: unset or empty is the default.
fn duration(
    env: &Env<'_>,
    name: &'static str,
    default: Duration,
) -> Result<Duration, SettingsError> {
    match (env.0)(name) {
        Some(raw) if !raw.trim().is_empty() => duration_value(name, &raw),
        _ => Ok(default),
    }
}

/// `host:port`, `[v6]:port`; grpc's `dns:///` and `passthrough:///`
/// prefixes are accepted.
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url
        .strip_prefix("dns:///")
        .or_else(|| url.strip_prefix("passthrough:///"))
        .unwrap_or(url);
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')?
            .parse::<std::net::Ipv6Addr>()
            .ok()?
            .to_string(),
        None if host.is_empty() || host.contains([':', '/', '@', ' ', '[', ']']) => return None,
        None => host.to_owned(),
    };
    Some((host, port))
}

/// `envconfig`'s `map[string]string`: `k1:v1,k2:v2`, each item exactly one
/// `:`; empty is none.
fn headers(raw: &str) -> Result<Vec<(String, String)>, SettingsError> {
    const NAME: &str = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    if raw.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in raw.split(',') {
        let parts: Vec<&str> = item.split(':').collect();
        let [key, value] = parts[..] else {
            return Err(SettingsError::invalid(
                NAME,
                raw,
                &format!("invalid map item {item:?}: expected key:value items separated by ','"),
            ));
        };
        let key = key.to_ascii_lowercase();
        let valid_key = if key.ends_with("-bin") {
            tonic::metadata::BinaryMetadataKey::from_bytes(key.as_bytes()).is_ok()
        } else {
            tonic::metadata::AsciiMetadataKey::from_bytes(key.as_bytes()).is_ok()
                && value.parse::<tonic::metadata::AsciiMetadataValue>().is_ok()
        };
        if !valid_key || key.starts_with("grpc-") || key.starts_with(':') {
            return Err(SettingsError::invalid(
                NAME,
                raw,
                &format!("{item:?} is not a usable gRPC metadata header"),
            ));
        }
        out.push((key, value.to_owned()));
    }
    Ok(out)
}

fn tls(env: &Env<'_>, host: &str) -> Result<Option<XdsTls>, SettingsError> {
    if !env.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let path = |name: &str| (env.0)(name).filter(|s| !s.is_empty()).map(PathBuf::from);
    // Upstream loads the pair only when both are set.
    let client = match (
        path("CONFIG_GRPC_XDS_CLIENT_TLS_CERT"),
        path("CONFIG_GRPC_XDS_CLIENT_TLS_KEY"),
    ) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(SettingsError {
                name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
                message: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY \
                          go together"
                    .into(),
            })
        }
    };
    let san = (env.0)("CONFIG_GRPC_XDS_SERVER_TLS_SAN").filter(|s| !s.is_empty());
    let name = san.as_deref().unwrap_or(host);
    if rustls::pki_types::ServerName::try_from(name).is_err() {
        let var = if san.is_some() {
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN"
        } else {
            "CONFIG_GRPC_XDS_SERVER_URL"
        };
        return Err(SettingsError::invalid(
            var,
            name,
            "expected a DNS name or an IP address to verify the server's certificate for",
        ));
    }
    let tls = XdsTls {
        client,
        ca: path("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"),
        san,
    };
    check_files(&tls)?;
    Ok(Some(tls))
}

/// The files must be readable PEM now (upstream panics at start otherwise),
/// the key the certificate's, and the CA's certificates valid: each would
/// otherwise fail every connection to the control plane, retried for ever.
fn check_files(tls: &XdsTls) -> Result<(), SettingsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |name: &'static str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| SettingsError {
            name,
            message: format!("cannot read {}: {e}", path.display()),
        })
    };
    let certs = |name: &'static str, path: &PathBuf| {
        let pem = read(name, path)?;
        match CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>() {
            Ok(c) if !c.is_empty() => Ok(c),
            Ok(_) => Err(SettingsError {
                name,
                message: format!("{}: no CERTIFICATE block in it", path.display()),
            }),
            Err(e) => Err(SettingsError {
                name,
                message: format!("{}: not PEM: {e}", path.display()),
            }),
        }
    };
    if let Some((cert, key)) = &tls.client {
        let chain = certs("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert)?;
        let pem = read("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key)?;
        let der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| SettingsError {
            name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            message: format!("{}: no private key in it: {e}", key.display()),
        })?;
        let provider = rustls::crypto::ring::default_provider();
        rustls::sign::CertifiedKey::from_der(chain, der, &provider).map_err(|e| SettingsError {
            name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
            message: format!(
                "{} is not the key of {}: {e}",
                key.display(),
                cert.display()
            ),
        })?;
    }
    if let Some(ca) = &tls.ca {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca)? {
            roots.add(c).map_err(|e| SettingsError {
                name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
                message: format!("{}: a certificate that cannot be used: {e}", ca.display()),
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            host_port("localhost:18000"),
            Some(("localhost".into(), 18000))
        );
        assert_eq!(host_port("[::1]:1"), Some(("::1".into(), 1)));
        assert_eq!(host_port("dns:///eg:18001"), Some(("eg".into(), 18001)));
        for bad in ["localhost", "http://x:1", "x:y", ":1", "::1:5", "a b:1"] {
            assert_eq!(host_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn additional_headers_as_envconfig_reads_a_map() {
        assert_eq!(
            headers("X-A:1,b:two").unwrap(),
            vec![("x-a".into(), "1".into()), ("b".into(), "two".into())]
        );
        assert!(headers("").unwrap().is_empty());
        assert!(headers("a").is_err());
        assert!(headers("a:b:c").is_err());
        assert!(headers("a b:c").is_err());
    }
}
