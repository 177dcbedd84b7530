//! The front pages list every Cargo feature, public docs speak plainly, and
//! every example that serves reads `PORT` and prints a client to try it
//! with, naming what to install.

use crate::{read, root, rust_files};

/// The features of Cargo.toml's `[features]` table.
fn features() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let table = manifest.split("\n[features]\n").nth(1).unwrap();
    let table = &table[..table.find("\n[").unwrap()];
    table
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|name| name != "default")
        .collect()
}

#[test]
fn both_front_pages_list_every_feature() {
    let readme = read("README.md");
    let rustdoc = read("src/lib.rs");
    let features = features();
    assert!(features.len() >= 9, "{features:?}");
    for (page, text) in [("README.md", &readme), ("src/lib.rs", &rustdoc)] {
        for feature in &features {
            assert!(
                text.contains(&format!("| `{feature}`")),
                "{page}'s feature table lacks `{feature}`"
            );
        }
    }
}

#[test]
fn the_rustdoc_front_page_shows_redis() {
    let rustdoc = read("src/lib.rs");
    assert!(rustdoc.contains("//! # Limits shared by every instance: Redis"));
    assert!(rustdoc.contains("//! let store = RedisStore::builder()"));
}

/// Words a newcomer cannot be expected to know, and what to say instead.
/// (`tat`, a GCRA state's name in code, is defined where it is used.)
const JARGON: [(&str, &str); 5] = [
    ("TAT", "theoretical arrival time, or what it means"),
    ("@EntryTimes", "what the guard does"),
    ("laoqian", "user-42 or another plain key"),
    ("overflow state", "shared counter"),
    ("Overflow state", "shared counter"),
];

/// Whether `word` occurs in `line` as a word of its own.
fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn public_docs_speak_plainly() {
    let mut pages: Vec<(String, String)> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(|p| (p.to_string(), read(p)))
        .collect();
    // In source, the doc comments (what rustdoc renders) and examples whole.
    for path in rust_files("src").into_iter().chain(rust_files("examples")) {
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        let docs_only = name.starts_with("src");
        let text = text
            .lines()
            .map(|l| match docs_only {
                true if !["///", "//!"].iter().any(|d| l.trim_start().starts_with(d)) => "",
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        pages.push((name, text));
    }
    let mut found = Vec::new();
    for (name, text) in &pages {
        for (i, line) in text.lines().enumerate() {
            for (word, instead) in JARGON {
                if has_word(line, word) {
                    found.push(format!("{name}:{}: {word:?} (say: {instead})", i + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "jargon in public docs:\n{}",
        found.join("\n")
    );
}

#[test]
fn serving_examples_read_port_and_print_clients() {
    let mut serving = 0;
    for path in rust_files("examples") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(&path).unwrap();
        // bench_server is driven by `scripts/http_load.sh`, its port an argument.
        if !source.contains("bind(") || name == "bench_server.rs" {
            continue;
        }
        serving += 1;
        assert!(source.contains("\"PORT\""), "{name} reads no PORT");
        // What the `println!` calls print, however they are wrapped.
        let printed: String = source
            .split("println!(")
            .skip(1)
            .map(|call| &call[..call.find(");").unwrap_or(call.len())])
            .collect();
        assert!(
            ["curl ", "cargo run --example", "python3"]
                .iter()
                .any(|client| printed.contains(client)),
            "{name} prints no client line"
        );
        assert!(
            !source.contains("grpcurl"),
            "{name}: grpcurl is not installable everywhere"
        );
        if source.contains("python3") {
            assert!(
                source.contains("pip install"),
                "{name}: say what Python needs"
            );
        }
    }
    assert!(serving >= 3, "ugc, tower_service and grpc serve");
}
