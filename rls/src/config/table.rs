//! The loaded rule table: one tree per domain, upstream's
//! `rateLimitDescriptor`, and its debug dump.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::model::Limit;
use super::yaml::{RawDescriptor, RawRoot};

/// One level of a domain's tree.
#[derive(Debug, Default)]
pub struct Node {
    /// Children by `key` or `key_value` (patterns with `*` included).
    pub(crate) children: HashMap<String, Node>,
    /// The limit at this level.
    pub(crate) limit: Option<Arc<Limit>>,
    /// The children whose composite key holds `*`, in config order, split
    /// on `*` once here rather than per request.
    pub(crate) wildcards: Vec<(String, Vec<String>)>,
    pub(crate) value_to_metric: bool,
    pub(crate) share_threshold: bool,
}

/// Every domain's rules: what `/rlconfig` prints and requests are matched
/// against. Immutable; a reload builds a new one.
#[derive(Debug, Default)]
pub struct Table {
    pub(crate) domains: HashMap<String, Node>,
}

impl Table {
    /// Adds one file's domain; `merge` is `MERGE_DOMAIN_CONFIG`.
    pub(super) fn add(&mut self, root: RawRoot, merge: bool) -> Result<(), String> {
        if self.domains.contains_key(&root.domain) && !merge {
            return Err(format!("duplicate domain '{}' in config file", root.domain));
        }
        let prefix = format!("{}.", root.domain);
        let node = self.domains.entry(root.domain).or_default();
        node.add(root.descriptors, &prefix)
    }

    /// Whether no domain is loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every limit, in no particular order.
    pub fn limits(&self) -> Vec<&Limit> {
        fn walk<'t>(node: &'t Node, out: &mut Vec<&'t Limit>) {
            out.extend(node.limit.as_deref());
            for child in node.children.values() {
                walk(child, out);
            }
        }
        let mut out = Vec::new();
        for node in self.domains.values() {
            walk(node, &mut out);
        }
        out
    }

    /// The domains, sorted, and how many limits they hold in all.
    pub fn summary(&self) -> (Vec<&str>, usize) {
        fn limits(node: &Node) -> usize {
            usize::from(node.limit.is_some()) + node.children.values().map(limits).sum::<usize>()
        }
        let mut domains: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        domains.sort_unstable();
        (domains, self.domains.values().map(limits).sum())
    }

    /// Upstream's `Dump`: one line per limit,
    /// `<full key>: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false`,
    /// sorted here (upstream prints in map order), with the algorithm
    /// appended for the extension's limits.
    pub fn dump(&self) -> String {
        let mut lines = Vec::new();
        for node in self.domains.values() {
            node.dump(&mut lines);
        }
        lines.sort();
        lines.concat()
    }
}

impl Node {
    fn add(&mut self, descriptors: Vec<RawDescriptor>, parent: &str) -> Result<(), String> {
        for d in descriptors {
            let path = format!("{parent}{}", d.final_key);
            if self.children.contains_key(&d.final_key) {
                return Err(format!("duplicate descriptor composite key '{path}'"));
            }
            if d.final_key.contains('*') {
                let parts = d.final_key.split('*').map(str::to_owned).collect();
                self.wildcards.push((d.final_key.clone(), parts));
            }
            let mut child = Node {
                limit: d.limit.map(Arc::new),
                value_to_metric: d.value_to_metric,
                share_threshold: d.share_threshold,
                ..Node::default()
            };
            child.add(d.descriptors, &format!("{path}."))?;
            self.children.insert(d.final_key, child);
        }
        Ok(())
    }

    fn dump(&self, lines: &mut Vec<String>) {
        if let Some(l) = &self.limit {
            let unit = l.unit.map_or("UNKNOWN", |u| u.name());
            let mut line = format!(
                "{}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                l.full_key, l.requests_per_unit, l.shadow_mode, l.quota_mode
            );
            if l.algorithm != super::Algorithm::FixedWindow {
                let _ = write!(line, ", algorithm: {}", l.algorithm.name());
            }
            line.push('\n');
            lines.push(line);
        }
        for child in self.children.values() {
            child.dump(lines);
        }
    }
}
