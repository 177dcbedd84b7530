//! The floors of ARCHITECTURE.md, enforced: no file of the engine (what a
//! limit is, the algorithms, the stores, the direct API) names a module of
//! the middleware (the tower layer and what it renders), so the engine
//! stays usable, and testable, without HTTP; and no two files of src/ or
//! rls/src reach each other through their imports (`imports.rs`).

use std::path::{Path, PathBuf};

mod imports;

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
    "body", "check", "config", "future", "grpc", "info", "key", "layer", "meter", "mode",
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

#[test]
fn no_circle_among_the_files_of_src_or_rls() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    // rls/ is in the repository, not in the published crate.
    for root in [manifest.join("src"), manifest.join("rls/src")] {
        if !root.is_dir() {
            continue;
        }
        let edges = imports::edges(&root);
        assert!(
            edges.len() > 20,
            "the files of {} were read",
            root.display()
        );
        for circle in imports::circles(&edges) {
            let names: Vec<String> = circle.iter().map(|f| f.display().to_string()).collect();
            found.push(names.join(" -> "));
        }
    }
    assert!(
        found.is_empty(),
        "files that reach each other:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_import_scan_finds_a_circle_and_ignores_a_child_naming_its_parent() {
    let dir = std::env::temp_dir().join(format!("floors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    // a re-exports its child; the child names its parent (not an edge).
    write("a/mod.rs", "mod kid;\npub use kid::K;\nstruct P;\n");
    write("a/kid.rs", "use super::P;\npub struct K;\n");
    // b -> c -> b, one in a `use` group, one inline in code.
    write("b.rs", "use crate::{c::C, a::K};\npub struct B;\n");
    write(
        "c.rs",
        "// crate::a is a comment\npub struct C(crate::b::B);\nconst S: &str = \"crate::a\";\n",
    );
    let edges = imports::edges(&dir);
    let circles = imports::circles(&edges);
    let named = |from: &str| -> Vec<String> {
        edges[&dir.join(from)]
            .iter()
            .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
            .collect()
    };
    assert_eq!(named("a/kid.rs"), Vec::<String>::new());
    assert_eq!(named("a/mod.rs"), ["a/kid.rs"]);
    assert_eq!(named("b.rs"), ["a/mod.rs", "c.rs"]);
    assert_eq!(named("c.rs"), ["b.rs"]);
    assert_eq!(circles.len(), 1, "{circles:?}");
    let mut circle: Vec<_> = circles[0]
        .iter()
        .map(|f| f.strip_prefix(&dir).unwrap().to_owned())
        .collect();
    circle.sort();
    assert_eq!(circle, [PathBuf::from("b.rs"), PathBuf::from("c.rs")]);
    std::fs::remove_dir_all(&dir).unwrap();
}
