//! Leaf values as upstream's YAML decoder (gopkg.in/yaml.v2 into typed
//! structs) reads them, and the recursive key check of `validateYamlKeys`
//! for values this server does not read.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Upstream's `validKeys`: accepted anywhere (outside `metadata`).
pub(super) const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// `config error, unknown key 'x'`, upstream's words.
pub(super) fn unknown_key<E: de::Error>(key: &str) -> E {
    E::custom(format_args!("config error, unknown key '{key}'"))
}

/// Keys of `rate_limit` this server adds: refused in strict mode.
pub(super) const EXTENSION_KEYS: [&str; 4] = ["algorithm", "max_burst", "burst", "concurrency"];

/// A mapping key: a string, as upstream requires, and a known one (checked
/// here so an error points at the key's own line).
#[derive(Clone, Copy)]
pub(super) struct Key {
    /// Whether the extension keys are known here.
    pub(super) extension: bool,
}

/// A key where only upstream's keys are known.
pub(super) const KEY: Key = Key { extension: false };

impl<'de> DeserializeSeed<'de> for Key {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(KeyVisitor(self))
    }
}

struct KeyVisitor(Key);

fn not_string<E: de::Error>(key: impl fmt::Display) -> E {
    E::custom(format_args!(
        "config error, key is not of type string: {key}"
    ))
}

impl Visitor<'_> for KeyVisitor {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        if VALID_KEYS.contains(&v) || (self.0.extension && EXTENSION_KEYS.contains(&v)) {
            Ok(v.to_owned())
        } else {
            Err(unknown_key(v))
        }
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Err(not_string(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Err(not_string(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Err(not_string(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Err(not_string(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(not_string("<nil>"))
    }
}

/// A string field: yaml.v2 takes any scalar's text; null is empty.
pub(super) struct Text;

impl<'de> DeserializeSeed<'de> for Text {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<String, E> {
        Err(E::custom("error checking config"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
    fn visit_none<E: de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
}

/// A boolean field; YAML 1.1's `yes`/`no`/`on`/`off` as yaml.v2 reads them.
pub(super) struct Flag;

impl<'de> DeserializeSeed<'de> for Flag {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(FlagVisitor)
    }
}

struct FlagVisitor;

impl Visitor<'_> for FlagVisitor {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("true or false")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        match v {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
            _ => Err(E::invalid_type(de::Unexpected::Str(v), &self)),
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
}

/// An unsigned field of `bits` bits (`requests_per_unit` is a uint32).
pub(super) struct Whole(pub(super) u32);

impl<'de> DeserializeSeed<'de> for Whole {
    type Value = u64;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for Whole {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a whole number below 2^{}", self.0)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        if self.0 < 64 && v >> self.0 != 0 {
            return Err(E::invalid_value(de::Unexpected::Unsigned(v), &self));
        }
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
        }
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
}

/// A value this server does not read (a known key out of its place,
/// which upstream ignores too): only its keys are checked, recursively,
/// as `validateYamlKeys` does. `metadata` is free.
pub(super) struct Checked;

impl<'de> DeserializeSeed<'de> for Checked {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(CheckedVisitor { in_list: false })
    }
}

struct CheckedVisitor {
    in_list: bool,
}

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KEY)? {
            if !VALID_KEYS.contains(&key.as_str()) {
                return Err(unknown_key(&key));
            }
            if key == "metadata" {
                map.next_value::<IgnoredAny>()?;
            } else {
                map.next_value_seed(Checked)?;
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.in_list {
            return Err(not_a_map("[...]"));
        }
        while seq.next_element_seed(MapOnly)?.is_some() {}
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.leaf(v)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.leaf(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.leaf(v)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.leaf(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.leaf("<nil>")
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom("error checking config"))
    }
}

impl CheckedVisitor {
    fn leaf<E: de::Error>(&self, v: impl fmt::Display) -> Result<(), E> {
        if self.in_list {
            return Err(not_a_map(v));
        }
        Ok(())
    }
}

/// `config error, yaml file contains list of type other than map: x`.
pub(super) fn not_a_map<E: de::Error>(v: impl fmt::Display) -> E {
    E::custom(format_args!(
        "config error, yaml file contains list of type other than map: {v}"
    ))
}

/// An element of a list: upstream accepts only mappings there.
struct MapOnly;

impl<'de> DeserializeSeed<'de> for MapOnly {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(CheckedVisitor { in_list: true })
    }
}
