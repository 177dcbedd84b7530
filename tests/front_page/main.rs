//! What a newcomer reads first, held to what it promises: README's quick
//! start followed in a new crate (`quick_start`, on request), and the front
//! pages, public docs and examples (`pages`).

mod pages;
mod quick_start;

use std::path::{Path, PathBuf};

/// A file of this repository, by its path from the root.
fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rs` files under `dir` (from the root), recursively.
fn rust_files(dir: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![root().join(dir)];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
