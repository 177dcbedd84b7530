//! A test PKI made at test time by the `openssl` CLI: a CA, a server
//! certificate for 127.0.0.1 and `localhost`, and a client certificate, PEM.
//! Shared through `#[path]` by the TLS suites (Redis, gRPC, and `rls/`, whose
//! gRPC PKI is made in a `CertDir`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary directory of certificates made by the `openssl` CLI,
/// removed on drop (the gRPC suite of `rls/` builds its own PKI on it).
pub struct CertDir {
    dir: PathBuf,
}

impl CertDir {
    /// A new directory named `prefix-<pid>-<n>` under the system's temp dir.
    pub fn new(prefix: &str) -> CertDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        CertDir { dir }
    }

    /// Runs `openssl args` in the directory; panics with its stderr.
    pub fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("the openssl CLI is needed to make test certificates");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes `file` in the directory.
    pub fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.join(file), text).unwrap();
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }
}

impl Drop for CertDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, PEM.
/// The server's is a client certificate too: cluster nodes present it to
/// each other on the bus, which always verifies it.
pub struct Pki {
    certs: CertDir,
}

impl Pki {
    pub fn new() -> Pki {
        let certs = CertDir::new("tower-throttle-tls");
        let o = |args: &[&str]| certs.openssl(args);
        o(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tower-throttle test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            certs.write(&format!("{name}.ext"), ext);
            o(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ]);
            o(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.crt"),
                "-extfile",
                &format!("{name}.ext"),
            ]);
        }
        Pki { certs }
    }

    #[allow(dead_code)] // Redis takes paths; gRPC reads the files.
    pub fn path(&self, file: &str) -> String {
        self.certs.path(file)
    }

    pub fn read(&self, file: &str) -> Vec<u8> {
        self.certs.read(file)
    }
}
