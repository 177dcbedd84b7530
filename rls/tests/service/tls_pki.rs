//! Certificates for the gRPC TLS tests, made at test time by the `openssl`
//! CLI (as the crate's `tests/support/pki.rs` makes its own): two CAs,
//! server certificates for 127.0.0.1 and `localhost`, and client
//! certificates with chosen subject alternative names. ECDSA P-256.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct Pki {
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl CLI is needed to make test certificates");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    /// `ca` and `ca2`; `server` (by `ca`) and `server2` (by `ca2`) for
    /// 127.0.0.1 and localhost; clients by `ca`: `client` (SAN
    /// `envoy.example.com`), `intruder` (SAN `intruder.example.com`),
    /// `wildcard` (SAN `*.example.com`); and `stranger` (by `ca2`, SAN
    /// `envoy.example.com`).
    pub fn new() -> Pki {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "throttle-rls-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
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
            openssl(&dir, &args);
        }
        let pki = Pki { dir };
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
        let o = |args: &[&str]| openssl(&self.dir, args);
        std::fs::write(self.dir.join(format!("{name}.ext")), ext).unwrap();
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
        self.dir.join(file).display().to_string()
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
