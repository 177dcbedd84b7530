//! README's quick start, followed as a newcomer with only the repository
//! would: a new crate, the `cargo add` lines (the `path` one, pointed at
//! this checkout), the snippet as `src/main.rs`, then `cargo run`; then the
//! same with the hand-written `[dependencies]` instead. Builds a crate from
//! scratch (about a minute), so it runs on request and in CI:
//! `cargo test --test front_page -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::read;

const CLONE: &str = "../tower-throttle";

/// The README's quick-start section.
fn section() -> String {
    let readme = read("README.md");
    let start = readme
        .find("## Quick start\n")
        .expect("a Quick start section");
    let rest = &readme[start + 3..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_owned()
}

/// The fenced blocks of `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    text.split(&fence)
        .skip(1)
        .map(|b| b[..b.find("```").unwrap()].to_owned())
        .collect()
}

fn cargo(dir: &Path, target: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .arg("--offline")
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo {args:?} failed:\n{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the new crate and checks what the README says it prints.
fn run(dir: &Path, target: &Path) {
    let printed = cargo(dir, target, &["run", "-q"]);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 6, "{printed}");
    assert!(lines[..5].iter().all(|l| l.contains("posted")), "{printed}");
    assert!(lines[5].contains("slow down"), "{printed}");
}

#[test]
#[ignore = "builds a new crate: cargo test --test front_page -- --ignored"]
fn the_quick_start_works_from_the_repository_alone() {
    let section = section();
    let here = env!("CARGO_MANIFEST_DIR");
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("quick_start");
    let (dir, target) = (scratch.join("hello"), scratch.join("target"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&scratch).unwrap();
    cargo(&scratch, &target, &["new", "--vcs", "none", "hello"]);

    // The `cargo add` lines of the first shell block, with `path`.
    let adds = blocks(&section, "sh").remove(0);
    let adds: Vec<&str> = adds.lines().collect();
    assert!(adds.iter().any(|l| l.contains(&format!("--path {CLONE}"))));
    for line in adds {
        let line = line.replace(CLONE, here);
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        cargo(&dir, &target, &args);
    }
    let main = blocks(&section, "rust").remove(0);
    std::fs::write(dir.join("src/main.rs"), main).unwrap();
    run(&dir, &target);

    // The hand-written `[dependencies]`, with `path`.
    let manifest = blocks(&section, "toml").remove(0);
    assert!(manifest.starts_with("[dependencies]\n"), "{manifest}");
    let package = "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n";
    let manifest = format!("{package}{}", manifest.replace(CLONE, here));
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    run(&dir, &target);

    // The git alternatives name one URL, in both forms.
    let git_add = blocks(&section, "sh").remove(1);
    let url = git_add.split("--git ").nth(1).unwrap().trim();
    let git_toml = blocks(&section, "toml").remove(1);
    assert!(git_toml.contains(&format!("git = \"{url}\"")), "{git_toml}");
}
