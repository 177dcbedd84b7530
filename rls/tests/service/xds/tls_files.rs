//! The control plane's TLS files are checked whole at start: a client key
//! that is not the certificate's, or a CA file whose certificate cannot be
//! used, would fail every connection to the control plane, retried for
//! ever.

use throttle_rls::settings::{Settings, SettingsError};

use crate::tls_pki::Pki;

fn xds_tls(cert: &str, key: &str, ca: &str) -> Result<Settings, SettingsError> {
    let vars = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca),
        ("USE_STATSD", "false"),
    ];
    Settings::from_lookup(&|name| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    })
}

#[test]
fn a_key_that_is_not_the_certificates_or_an_unusable_ca_is_refused_at_start() {
    let pki = Pki::new();
    let (cert, key, ca) = (
        pki.path("client.crt"),
        pki.path("client.key"),
        pki.path("ca.crt"),
    );
    assert!(xds_tls(&cert, &key, &ca).is_ok(), "the matching pair loads");
    // Another client's key, from the same CA.
    let e = xds_tls(&cert, &pki.path("intruder.key"), &ca).unwrap_err();
    assert_eq!(e.name, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "{e}");
    assert!(e.message.contains("is not the key of"), "{e}");
    // PEM whose DER is not a certificate.
    pki.write(
        "garbled.crt",
        "-----BEGIN CERTIFICATE-----\nAAECAwQFBgcICQ==\n-----END CERTIFICATE-----\n",
    );
    let e = xds_tls(&cert, &key, &pki.path("garbled.crt")).unwrap_err();
    assert_eq!(e.name, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "{e}");
}
