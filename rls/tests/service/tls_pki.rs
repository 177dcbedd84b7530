//! Certificates for the gRPC TLS tests, made at test time by the `openssl`
//! CLI in a `CertDir` of the crate's `tests/support/pki.rs`: two CAs,
//! server certificates for 127.0.0.1 and `localhost`, and client
//! certificates with chosen subject alternative names. ECDSA P-256.

use crate::shared_pki::CertDir;

pub struct Pki {
    certs: CertDir,
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    /// `ca` and `ca2`; `server` (by `ca`) and `server2` (by `ca2`) for
    /// 127.0.0.1 and localhost; clients by `ca`: `client` (SAN
    /// `envoy.example.com`), `intruder` (SAN `intruder.example.com`),
    /// `wildcard` (SAN `*.example.com`); and `stranger` (by `ca2`, SAN
    /// `envoy.example.com`).
    pub fn new() -> Pki {
        let certs = CertDir::new("throttle-rls-tls");
        for ca in ["ca", "ca2"] {
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=rls test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(EC);
            args.extend([
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &crt,
                "-days",
                "2",
                "-subj",
                &subj,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            certs.openssl(&args);
        }
        let pki = Pki { certs };
        let server = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
        pki.issue("server", "ca", server);
        pki.issue("server2", "ca2", server);
        for (name, ca, san) in [
            ("client", "ca", "envoy.example.com"),
            ("intruder", "ca", "intruder.example.com"),
            ("wildcard", "ca", "*.example.com"),
            ("stranger", "ca2", "envoy.example.com"),
        ] {
            let ext = format!("subjectAltName=DNS:{san}\nextendedKeyUsage=clientAuth\n");
            pki.issue(name, ca, &ext);
        }
        pki
    }

    fn issue(&self, name: &str, ca: &str, ext: &str) {
        let o = |args: &[&str]| self.certs.openssl(args);
        self.certs.write(&format!("{name}.ext"), ext);
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        let subj = format!("/CN={name}");
        let mut args = vec!["req"];
        args.extend(EC);
        args.extend(["-nodes", "-keyout", &key, "-out", &csr, "-subj", &subj]);
        o(&args);
        let (ca_crt, ca_key, extfile) = (
            format!("{ca}.crt"),
            format!("{ca}.key"),
            format!("{name}.ext"),
        );
        o(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &extfile,
        ]);
    }

    pub fn path(&self, file: &str) -> String {
        self.certs.path(file)
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        self.certs.read(file)
    }

    pub fn write(&self, file: &str, text: &str) {
        self.certs.write(file, text)
    }
}
