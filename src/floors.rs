//! The floors of ARCHITECTURE.md, enforced: no file of the engine (what a
//! limit is, the algorithms, the stores, the direct API) names a module of
//! the middleware (the tower layer and what it renders), so the engine
//! stays usable, and testable, without HTTP.

use std::path::{Path, PathBuf};

/// The engine's modules: files `src/<name>.rs` or folders `src/<name>/`.
const ENGINE: &[&str] = &[
    "algorithm",
    "clock",
    "decision",
    "limiter",
    "lockout",
    "multi",
    "policy",
    "store",
];

/// The middleware's modules, which the engine must not name.
const MIDDLEWARE: &[&str] = &[
    "body", "check", "fields", "future", "grpc", "info", "key", "layer", "mode", "outcome",
    "resolve", "response", "rule", "service", "settings", "upgrade",
];

fn sources(at: &Path, out: &mut Vec<PathBuf>) {
    if at.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(at)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            sources(&entry, out);
        }
    } else if at.is_file() && at.extension().is_some_and(|e| e == "rs") {
        out.push(at.to_path_buf());
    }
}

/// The middleware modules `line` names as `crate::<module>`.
fn named<'a>(line: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    MIDDLEWARE.iter().copied().filter(move |m| {
        line.match_indices("crate::").any(|(i, _)| {
            line[i + 7..]
                .strip_prefix(m)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        })
    })
}

#[test]
fn no_engine_file_names_a_middleware_module() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for module in ENGINE {
        sources(&src.join(module), &mut files);
        sources(&src.join(format!("{module}.rs")), &mut files);
    }
    assert!(files.len() > 40, "the engine's files were found: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            // Doc links may point upward; code may not.
            if line.trim_start().starts_with("//") {
                continue;
            }
            for m in named(line) {
                found.push(format!("{}:{}: crate::{m}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the engine names the middleware:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_a_middleware_path() {
    assert_eq!(
        named("use crate::key::PeerIp;").collect::<Vec<_>>(),
        ["key"]
    );
    assert_eq!(
        named("crate::settings::X + crate::store::Y").collect::<Vec<_>>(),
        ["settings"]
    );
    assert!(named("use crate::keyring;").next().is_none());
}
