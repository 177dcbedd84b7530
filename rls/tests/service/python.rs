//! The foreign client: the rls-kit's Python `grpcio` + `xds-protos` client
//! replays upstream's integration tests and README examples (its `cases/`)
//! against the `throttle-rls` binary, one fresh server per case, over gRPC
//! and over `/json`.
//!
//! The kit (a copy of the helper's kit, without its venv and its throwaway
//! fake server) is looked for in `$RLS_KIT_DIR`, else `rls/tests/rls-kit`. Its
//! requirements are installed into a venv under the target directory; when
//! python3 or pip cannot do that, the test fails saying so (set
//! `RLS_SKIP_PYTHON=1` to skip it on a machine without them).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_throttle-rls");

fn kit() -> PathBuf {
    std::env::var_os("RLS_KIT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls-kit"))
}

/// A venv with the kit's requirements, next to the test binary; made once
/// for both tests.
fn venv(kit: &Path) -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| make_venv(kit)).clone()
}

fn make_venv(kit: &Path) -> PathBuf {
    let target = Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let venv = target.join("rls-kit-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("requirements.installed");
    let requirements =
        std::fs::read_to_string(kit.join("requirements.txt")).expect("the kit's requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str()) {
        return python;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "cannot create a Python venv at {}: install python3 with its venv module (Debian: apt-get install python3-venv)",
        venv.display()
    );
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "-r"])
        .arg(kit.join("requirements.txt"))
        .status();
    assert!(
        pip.is_ok_and(|s| s.success()),
        "pip could not install the kit's requirements (grpcio, xds-protos, PyYAML) into {}: is PyPI reachable?",
        venv.display()
    );
    std::fs::write(&stamp, requirements).unwrap();
    python
}

fn replay(mode: &str) {
    if std::env::var_os("RLS_SKIP_PYTHON").is_some() {
        eprintln!("RLS_SKIP_PYTHON is set: the Python client is not run");
        return;
    }
    let kit = kit();
    assert!(
        kit.join("client.py").is_file(),
        "the rls-kit is missing at {} (set RLS_KIT_DIR)",
        kit.display()
    );
    let python = venv(&kit);
    let out = Command::new(python)
        .arg(kit.join("client.py"))
        .args(["--mode", mode, "--fail-on-skip", "--server-cmd", BIN])
        .args([
            "--server-env",
            "BACKEND_TYPE=memory",
            "--server-env",
            "RLS_TEST_CLOCK=true",
        ])
        .arg(kit.join("cases"))
        .output()
        .expect("run client.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the Python client found differences from upstream:\n{text}"
    );
}

#[test]
fn python_grpcio_client_replays_upstream_cases() {
    replay("grpc");
}

#[test]
fn python_client_over_json_replays_upstream_cases() {
    replay("json");
}
