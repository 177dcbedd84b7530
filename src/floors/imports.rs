//! Which file of a source tree names which other, and the circles that
//! makes. A file names another through a path: `crate::a::b`, `super::x`,
//! `self::x`, or a child module of its own (`plan::Plan`), in a `use` or
//! in code. A child naming its parent (or any ancestor) is not an edge:
//! a parent is its children's namespace, and they may use what it
//! declares. Every other edge counts, so a parent re-exporting its
//! child, and that child reaching a third file that names the parent
//! again, is a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The files of `root` (`.rs`), by module path (`["check", "plan"]`;
/// `mod.rs`, `lib.rs` and `main.rs` name their folder).
fn modules(root: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    parts.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    parts.pop();
                }
                out.entry(parts).or_insert(path);
            }
        }
    }
    out
}

/// `text` without comments, string and character literals.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") {
            i += rest.find("\"#").map_or(rest.len(), |e| e + 2).max(3);
            out.push_str("\"\"");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() && rest.as_bytes()[j] != b'"' {
                j += if rest.as_bytes()[j] == b'\\' { 2 } else { 1 };
            }
            i += (j + 1).min(rest.len());
            out.push_str("\"\"");
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::{d, e as f}}` → `a::b`, `a::c::d`,
/// `a::c::e`).
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or("").replace(' ', "")];
    };
    let prefix = tree[..open].trim().trim_end_matches("::").replace(' ', "");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    let mut out = Vec::new();
    for part in parts.iter().filter(|p| !p.trim().is_empty()) {
        for path in expand(part) {
            out.push(if prefix.is_empty() {
                path
            } else {
                format!("{prefix}::{path}")
            });
        }
    }
    out
}

/// The paths `code` names: its `use` trees and its inline paths.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let boundary = rest[..at].chars().next_back().is_none_or(|c| !word(c));
        let tail = &rest[at + 4..];
        match tail.find(';') {
            Some(end) if boundary => {
                out.extend(expand(&tail[..end]));
                rest = &tail[end..];
            }
            _ => rest = tail,
        }
    }
    // Inline paths: a run of `ident::ident…`.
    let squeezed: String = code.split_whitespace().collect::<Vec<_>>().join(" ");
    let squeezed = squeezed.replace(" ::", "::").replace(":: ", "::");
    let mut start = None;
    let chars: Vec<(usize, char)> = squeezed.char_indices().collect();
    for (k, &(i, c)) in chars.iter().enumerate() {
        let in_path = word(c)
            || (c == ':' && squeezed[i..].starts_with("::"))
            || (c == ':' && k > 0 && chars[k - 1].1 == ':');
        match (in_path, start) {
            (true, None) => {
                let after_word = k > 0 && word(chars[k - 1].1);
                if !after_word {
                    start = Some(i);
                }
            }
            (false, Some(s)) => {
                let run = &squeezed[s..i];
                if run.contains("::") {
                    out.push(run.trim_end_matches(':').to_owned());
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The child modules `code` declares (`mod x;`).
fn children(code: &str) -> BTreeSet<String> {
    code.split(';')
        .filter_map(|statement| {
            let words: Vec<&str> = statement.split_whitespace().collect();
            match words.as_slice() {
                [.., "mod", name] if name.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                    Some((*name).to_owned())
                }
                _ => None,
            }
        })
        .collect()
}

/// Every edge of the tree at `root`: file → the files it names.
pub(super) fn edges(root: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = modules(root);
    let resolve = |parts: &[String]| {
        (0..=parts.len())
            .rev()
            .find_map(|n| modules.get(&parts[..n]).map(|p| (parts[..n].to_vec(), p)))
    };
    let mut edges = BTreeMap::new();
    for (me, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let kids = children(&code);
        let mut named = BTreeSet::new();
        for path in paths(&code) {
            let mut segments: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let mut base = match segments.first().map(String::as_str) {
                Some("crate") => {
                    segments.remove(0);
                    Vec::new()
                }
                Some("super" | "self") => {
                    let mut base = me.clone();
                    while let Some(first) = segments.first() {
                        match first.as_str() {
                            "super" => drop(base.pop()),
                            "self" => {}
                            _ => break,
                        }
                        segments.remove(0);
                    }
                    base
                }
                Some(first) if kids.contains(first) => me.clone(),
                _ => continue,
            };
            base.extend(segments);
            let Some((target, target_file)) = resolve(&base) else {
                continue;
            };
            let ancestor = target.len() < me.len() && me[..target.len()] == target[..];
            if target_file != file && !ancestor {
                named.insert(target_file.clone());
            }
        }
        edges.insert(file.clone(), named);
    }
    edges
}

/// The circles of `edges`: each a set of files that reach one another
/// (Tarjan's strongly connected components of more than one file).
pub(super) fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a PathBuf) -> usize {
        let n = w.index.len();
        w.index.insert(v, n);
        w.stack.push(v);
        let mut low = n;
        for next in w.edges.get(v).into_iter().flatten() {
            let next_low = match w.index.get(next) {
                None => visit(w, next),
                Some(&i) if w.stack.contains(&next) => i,
                Some(_) => continue,
            };
            low = low.min(next_low);
        }
        if low == n {
            let at = w.stack.iter().position(|f| *f == v).unwrap();
            let component: Vec<PathBuf> = w.stack.drain(at..).cloned().collect();
            if component.len() > 1 {
                w.found.push(component);
            }
        }
        low
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for file in edges.keys() {
        if !walk.index.contains_key(file) {
            visit(&mut walk, file);
        }
    }
    walk.found
}
