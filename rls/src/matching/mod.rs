//! Finding a request descriptor's limit, as upstream's `GetLimit` does:
//! per level the exact `key_value`, then wildcard patterns in config order,
//! then the key alone; a limit counts only at the request's last entry.
//! Also the stats key (`value_to_metric`, `detailed_metric`) and the
//! `share_threshold` patterns that the counter key uses.
//!
//! Requests are matched as bytes: a value that is not UTF-8 equals no
//! configured value (those are text) but may match a wildcard's pattern,
//! and its key or domain equals no configured one. Statistics keys, being
//! metric names, hold such bytes as U+FFFD.

use std::sync::Arc;

use crate::config::{Algorithm, Limit, Node, Table, Unit};

/// The limit a descriptor matched.
#[derive(Clone, Debug)]
pub struct Matched {
    /// The limit (from the config, or the request's override).
    pub limit: Arc<Limit>,
    /// The key its statistics are kept under (`domain.key_value...`).
    pub stats_key: String,
    /// Per entry: the wildcard pattern that replaces its value in the
    /// counter key (`share_threshold`), if any.
    pub share: Vec<Option<String>>,
}

/// A request override (`descriptor.limit`) with a unit outside the enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadOverrideUnit(pub i32);

/// One descriptor of a request: its entries and its override, if any.
pub struct Query<'a> {
    /// `(key, value)` pairs, any bytes.
    pub entries: &'a [(Vec<u8>, Vec<u8>)],
    /// `limit { requests_per_unit, unit }` of the request.
    pub override_limit: Option<(u32, i32)>,
}

/// Upstream's `GetLimit`.
pub fn get_limit(
    table: &Table,
    domain: &[u8],
    q: &Query<'_>,
) -> Result<Option<Matched>, BadOverrideUnit> {
    let Some((domain, root)) = text(domain).and_then(|d| table.domains.get_key_value(d)) else {
        return Ok(None);
    };
    if let Some((rpu, unit)) = q.override_limit {
        return override_limit(domain, q.entries, rpu, unit).map(Some);
    }
    Ok(walk(root, domain, q.entries))
}

/// `bytes` if they are UTF-8: only then can they equal configured text.
fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok()
}

fn lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn override_limit(
    domain: &str,
    entries: &[(Vec<u8>, Vec<u8>)],
    rpu: u32,
    unit: i32,
) -> Result<Matched, BadOverrideUnit> {
    let unit = Unit::from_proto(unit).ok_or(BadOverrideUnit(unit))?;
    let key = descriptor_key(domain, entries);
    let policy = Algorithm::FixedWindow.policy(rpu, unit).ok().flatten();
    Ok(Matched {
        limit: Arc::new(Limit {
            full_key: key.clone(),
            requests_per_unit: rpu,
            unit: Some(unit),
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            algorithm: Algorithm::FixedWindow,
            policy,
        }),
        stats_key: key,
        share: Vec::new(),
    })
}

/// Upstream's `descriptorKey`: `domain.k1_v1.k2` (no `_` for an empty value).
fn descriptor_key(domain: &str, entries: &[(Vec<u8>, Vec<u8>)]) -> String {
    let mut key = format!("{domain}.");
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(&lossy(k));
        if !v.is_empty() {
            key.push('_');
            key.push_str(&lossy(v));
        }
    }
    key
}

/// `pattern` less its leading `key_`, if it has one.
fn strip_key(pattern: &str, key: &[u8]) -> String {
    pattern
        .as_bytes()
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix(b"_"))
        .and_then(|rest| pattern.get(pattern.len() - rest.len()..))
        .unwrap_or(pattern)
        .to_owned()
}

fn walk(root: &Node, domain: &str, entries: &[(Vec<u8>, Vec<u8>)]) -> Option<Matched> {
    let mut level = root;
    let mut detailed = domain.to_owned();
    let mut by_value = domain.to_owned();
    let mut share: Vec<Option<String>> = Vec::new();
    let mut found: Option<Arc<Limit>> = None;
    for (i, (k, v)) in entries.iter().enumerate() {
        let key_value = [k.as_slice(), b"_", v].concat();
        detailed.push('.');
        detailed.push_str(&lossy(&key_value));
        let mut next = text(&key_value).and_then(|kv| level.children.get(kv));
        let mut wildcard: Option<&str> = None;
        if next.is_none() {
            if let Some((pattern, _)) = level
                .wildcards
                .iter()
                .find(|(_, parts)| wildcard_match(parts, &key_value))
            {
                next = level.children.get(pattern);
                wildcard = Some(pattern);
            }
        }
        let matched_value = next.is_some();
        if next.is_none() {
            next = text(k).and_then(|k| level.children.get(k));
        }
        let strip = |p: &str| strip_key(p, k);
        if let (Some(pattern), Some(n)) = (wildcard, next) {
            if n.share_threshold {
                share.resize(entries.len(), None);
                share[i] = Some(strip(pattern));
            }
        }
        by_value.push('.');
        by_value.push_str(&lossy(k));
        if let Some(n) = next {
            let shared = share.get(i).cloned().flatten();
            let value = match wildcard {
                Some(_) if shared.is_some() => shared.unwrap_or_default(),
                Some(_) if n.value_to_metric => lossy(v).into_owned(),
                Some(pattern) => strip(pattern),
                None if matched_value || n.value_to_metric => lossy(v).into_owned(),
                None => String::new(),
            };
            if !value.is_empty() {
                by_value.push('_');
                by_value.push_str(&value);
            }
            if let Some(limit) = &n.limit {
                if i + 1 == entries.len() {
                    found = Some(limit.clone());
                }
            }
        }
        match next {
            Some(n) if !n.children.is_empty() => level = n,
            _ => break,
        }
    }
    let limit = found?;
    let stats_key = if limit.detailed_metric {
        if share.iter().any(Option::is_some) {
            shared_stats_key(domain, entries, &share)
        } else {
            detailed
        }
    } else {
        by_value
    };
    Some(Matched {
        limit,
        stats_key,
        share,
    })
}

fn shared_stats_key(
    domain: &str,
    entries: &[(Vec<u8>, Vec<u8>)],
    share: &[Option<String>],
) -> String {
    let mut key = domain.to_owned();
    for (i, (k, v)) in entries.iter().enumerate() {
        key.push('.');
        key.push_str(&lossy(k));
        match share.get(i).cloned().flatten() {
            Some(p) => {
                key.push('_');
                key.push_str(&p);
            }
            None if !v.is_empty() => {
                key.push('_');
                key.push_str(&lossy(v));
            }
            None => {}
        }
    }
    key
}

/// Whether `value` matches a pattern split on `*` (each `*` matches any
/// run of bytes, empty included), as upstream's `wildcardMatch` (which
/// works on Go strings, that is bytes).
pub fn wildcard_match(parts: &[String], value: &[u8]) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return first.as_bytes() == value;
    }
    if !value.starts_with(first.as_bytes()) || !value.ends_with(last.as_bytes()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match find(rest, part.as_bytes()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Where `needle` first occurs in `hay`: `str::find` (linear) for text,
/// else a plain search, bounded by `RLS_MAX_VALUE_BYTES` and the pattern.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if let (Some(hay), Some(needle)) = (text(hay), text(needle)) {
        return hay.find(needle);
    }
    if needle.is_empty() {
        return Some(0);
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
