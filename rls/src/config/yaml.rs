//! One config file, read with upstream's schema: the visitors check every
//! key and every rule as they go, so an error carries the line and the
//! field path of the descriptor at fault (yaml_serde marks errors raised
//! inside a value with that value's position).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::model::Limit;
use super::rate_limit::{Checked, DescriptorFlags, RateLimitSeed};
use super::values::{not_a_map, unknown_key, Checked as Unread, Flag, Text, KEY, VALID_KEYS};

/// How strictly to read.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Options {
    /// Reject the extension keys (`algorithm`, `burst`) as upstream would.
    pub(super) strict: bool,
}

/// A file: its domain and descriptors.
#[derive(Debug, Default)]
pub(super) struct RawRoot {
    pub(super) domain: String,
    pub(super) descriptors: Vec<RawDescriptor>,
}

/// One descriptor of a file, checked.
#[derive(Debug)]
pub(super) struct RawDescriptor {
    /// `key` or `key_value`.
    pub(super) final_key: String,
    pub(super) limit: Option<Limit>,
    pub(super) descriptors: Vec<RawDescriptor>,
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: bool,
}

/// Reads a whole file.
pub(super) struct Root(pub(super) Options);

impl<'de> DeserializeSeed<'de> for Root {
    type Value = RawRoot;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawRoot, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Root {
    type Value = RawRoot;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping with `domain` and `descriptors`")
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawRoot, E> {
        Ok(RawRoot::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawRoot, A::Error> {
        // The domain may come after the descriptors: keep their keys
        // relative and prefix the domain at the end.
        let mut root = RawRoot::default();
        while let Some(key) = map.next_key_seed(KEY)? {
            match key.as_str() {
                "domain" => root.domain = map.next_value_seed(Text)?,
                "descriptors" => {
                    root.descriptors = map.next_value_seed(Descriptors {
                        parent: String::new(),
                        options: self.0,
                    })?
                }
                "metadata" => drop(map.next_value::<IgnoredAny>()?),
                k if VALID_KEYS.contains(&k) => map.next_value_seed(Unread)?,
                k => return Err(unknown_key(k)),
            }
        }
        if root.domain.is_empty() {
            return Err(de::Error::custom("config file cannot have empty domain"));
        }
        let prefix = format!("{}.", root.domain);
        prefix_keys(&mut root.descriptors, &prefix);
        Ok(root)
    }
}

fn prefix_keys(descriptors: &mut [RawDescriptor], prefix: &str) {
    for d in descriptors {
        if let Some(limit) = &mut d.limit {
            limit.full_key.insert_str(0, prefix);
        }
        prefix_keys(&mut d.descriptors, prefix);
    }
}

/// A `descriptors` list; `parent` is the composite key above it (`a.b_c.`).
struct Descriptors {
    parent: String,
    options: Options,
}

impl<'de> DeserializeSeed<'de> for Descriptors {
    type Value = Vec<RawDescriptor>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Descriptors {
    type Value = Vec<RawDescriptor>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of descriptors")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut siblings = HashSet::new();
        let mut out = Vec::new();
        while let Some(d) = seq.next_element_seed(Descriptor {
            parent: &self.parent,
            siblings: &mut siblings,
            options: self.options,
        })? {
            out.push(d);
        }
        Ok(out)
    }
}

struct Descriptor<'a> {
    parent: &'a str,
    siblings: &'a mut HashSet<String>,
    options: Options,
}

impl<'de> DeserializeSeed<'de> for Descriptor<'_> {
    type Value = RawDescriptor;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawDescriptor, D::Error> {
        d.deserialize_any(self)
    }
}

/// The fields of one descriptor as written.
#[derive(Default)]
pub(super) struct Fields {
    key: String,
    value: String,
    rate_limit: Option<Checked>,
    descriptors: Vec<RawDescriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    value_to_metric: bool,
    share_threshold: bool,
}

impl<'de> Visitor<'de> for Descriptor<'_> {
    type Value = RawDescriptor;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a descriptor (a mapping with `key`)")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDescriptor, A::Error> {
        let mut f = Fields::default();
        let mut nested = None;
        while let Some(key) = map.next_key_seed(KEY)? {
            match key.as_str() {
                "key" => f.key = map.next_value_seed(Text)?,
                "value" => f.value = map.next_value_seed(Text)?,
                "rate_limit" => {
                    f.rate_limit = map.next_value_seed(RateLimitSeed {
                        strict: self.options.strict,
                    })?
                }
                "descriptors" => {
                    // Their composite keys need ours, which may not be read yet.
                    nested = Some(map.next_value_seed(Descriptors {
                        parent: String::new(),
                        options: self.options,
                    })?)
                }
                "shadow_mode" => f.shadow_mode = map.next_value_seed(Flag)?,
                "quota_mode" => f.quota_mode = map.next_value_seed(Flag)?,
                "detailed_metric" => f.detailed_metric = map.next_value_seed(Flag)?,
                "value_to_metric" => f.value_to_metric = map.next_value_seed(Flag)?,
                "share_threshold" => f.share_threshold = map.next_value_seed(Flag)?,
                "metadata" => drop(map.next_value::<IgnoredAny>()?),
                k if VALID_KEYS.contains(&k) => map.next_value_seed(Unread)?,
                k => return Err(unknown_key(k)),
            }
        }
        f.descriptors = nested.unwrap_or_default();
        finish(self.parent, self.siblings, f).map_err(de::Error::custom)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDescriptor, E> {
        Err(not_a_map(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDescriptor, E> {
        Err(not_a_map(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDescriptor, E> {
        Err(not_a_map(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawDescriptor, E> {
        Err(not_a_map(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<RawDescriptor, E> {
        Err(not_a_map("<nil>"))
    }
}

/// Upstream's `loadDescriptors` checks, in its order and words.
fn finish(
    parent: &str,
    siblings: &mut HashSet<String>,
    f: Fields,
) -> Result<RawDescriptor, String> {
    if f.key.is_empty() {
        return Err("descriptor has empty key".into());
    }
    let final_key = if f.value.is_empty() {
        f.key.clone()
    } else {
        format!("{}_{}", f.key, f.value)
    };
    let path = format!("{parent}{final_key}");
    if !siblings.insert(final_key.clone()) {
        return Err(format!("duplicate descriptor composite key '{path}'"));
    }
    let mut f = f;
    let flags = DescriptorFlags {
        shadow_mode: f.shadow_mode,
        quota_mode: f.quota_mode,
        detailed_metric: f.detailed_metric,
    };
    let limit = f.rate_limit.take().map(|rl| rl.into_limit(&path, flags));
    if f.share_threshold && !final_key.contains('*') {
        return Err(format!(
            "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
        ));
    }
    let mut descriptors = f.descriptors;
    prefix_keys(&mut descriptors, &format!("{final_key}."));
    Ok(RawDescriptor {
        final_key,
        limit,
        descriptors,
        value_to_metric: f.value_to_metric,
        share_threshold: f.share_threshold,
    })
}
