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
    "policy",
    "store",
];

/// The middleware's modules, which the engine must not name.
const MIDDLEWARE: &[&str] = &[
    "body", "check", "config", "fields", "future", "grpc", "info", "key", "layer", "mode",
    "outcome", "resolve", "response", "rule", "service", "settings", "upgrade",
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

/// The sibling modules a file names through `super::` (`super::b::X`,
/// `super::{a, b}`).
fn siblings_named(text: &str, siblings: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut push = |name: &str| {
        let name = name.trim().split("::").next().unwrap_or("").trim();
        if siblings.iter().any(|s| s == name) && !found.iter().any(|f| f == name) {
            found.push(name.to_owned());
        }
    };
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("super::") {
            let rest = &line[i + 7..];
            if let Some(list) = rest.strip_prefix('{') {
                list.split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .for_each(&mut push);
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                push(&rest[..end]);
            }
        }
    }
    found
}

#[test]
fn no_two_sibling_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src];
    let mut circles = Vec::new();
    while let Some(dir) = dirs.pop() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_stem().is_some_and(|s| s != "mod" && s != "lib")
            {
                files.push(path);
            }
        }
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        let named: Vec<Vec<String>> = files
            .iter()
            .map(|f| siblings_named(&std::fs::read_to_string(f).unwrap(), &names))
            .collect();
        for (i, a) in names.iter().enumerate() {
            for b in &named[i] {
                let j = names.iter().position(|n| n == b).unwrap();
                if i < j && named[j].contains(a) {
                    circles.push(format!("{} <-> {b}", dir.join(a).display()));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_sibling_scan_sees_both_forms() {
    let siblings = ["plan".to_owned(), "choose".to_owned(), "hold".to_owned()];
    let text = "use super::plan::Plan;\nuse super::{count, hold, LayerState};\n// super::choose\n";
    assert_eq!(siblings_named(text, &siblings), ["plan", "hold"]);
}
