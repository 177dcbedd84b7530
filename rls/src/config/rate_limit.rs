//! A descriptor's `rate_limit` mapping, checked where it is written so
//! errors point at it: unit, `unlimited`, `replaces`, and the extension
//! keys `algorithm` and `burst`.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::model::{Algorithm, Limit, Unit};
use super::values::{
    not_a_map, unknown_key, Checked as Unread, Flag, Key, Text, Whole, KEY, VALID_KEYS,
};

/// A `rate_limit` mapping as written.
#[derive(Default)]
struct RawRateLimit {
    requests_per_unit: u32,
    unit: String,
    unlimited: bool,
    name: String,
    replaces: Vec<String>,
    algorithm: Option<String>,
    burst: Option<u64>,
    /// The key `burst` was written under: `max_burst`, or its older spelling.
    burst_key: &'static str,
}

/// A `rate_limit` checked on its own (so errors point at its line).
pub(super) struct Checked {
    raw: RawRateLimit,
    unit: Option<Unit>,
    algorithm: Algorithm,
    policy: Option<tower_throttle::Policy>,
}

impl RawRateLimit {
    fn check(self) -> Result<Checked, String> {
        let unit = Unit::parse(&self.unit);
        if self.unlimited && unit.is_some() {
            return Err("should not specify rate limit unit when unlimited".into());
        }
        if !self.unlimited && unit.is_none() {
            return Err(format!("invalid rate limit unit '{}'", self.unit));
        }
        for name in &self.replaces {
            if name.is_empty() {
                return Err("should not have an empty replaces entry".into());
            }
            if *name == self.name {
                return Err("replaces should not contain name of same descriptor".into());
            }
        }
        let algorithm = match (self.algorithm.as_deref(), self.burst) {
            (None | Some("fixed_window"), None) => Algorithm::FixedWindow,
            (Some("sliding_window"), None) => Algorithm::SlidingWindow,
            (Some("sliding_log"), None) => Algorithm::SlidingLog,
            (Some("gcra"), burst) => {
                if let (Some(n), "burst") = (burst, self.burst_key) {
                    tracing::warn!(
                        burst = n,
                        "`burst` is redis-cell's max_burst: {} hits are admitted at once; write `max_burst: {n}` to say so",
                        n.saturating_add(1)
                    );
                }
                Algorithm::Gcra {
                    burst: burst.unwrap_or(0),
                }
            }
            (Some(other), None) => {
                return Err(format!(
                    "unknown algorithm '{other}' (expected fixed_window, sliding_window, sliding_log or gcra)"
                ))
            }
            (_, Some(_)) => return Err("max_burst applies only to algorithm: gcra".into()),
        };
        if self.unlimited && algorithm != Algorithm::FixedWindow {
            return Err("an unlimited rate_limit takes no algorithm".into());
        }
        let policy = match unit {
            Some(unit) if !self.unlimited => algorithm
                .policy(self.requests_per_unit, unit)
                .map_err(|e| format!("algorithm {}: {e}", algorithm.name()))?,
            _ => None,
        };
        Ok(Checked {
            raw: self,
            unit,
            algorithm,
            policy,
        })
    }
}

impl Checked {
    /// The limit at `path`, with its descriptor's flags.
    pub(super) fn into_limit(self, path: &str, flags: DescriptorFlags) -> Limit {
        Limit {
            full_key: path.to_owned(),
            requests_per_unit: self.raw.requests_per_unit,
            unit: self.unit,
            unlimited: self.raw.unlimited,
            name: self.raw.name,
            replaces: self.raw.replaces,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            algorithm: self.algorithm,
            policy: self.policy,
        }
    }
}

/// The flags of the descriptor a limit belongs to.
pub(super) struct DescriptorFlags {
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
}

/// Reads a `rate_limit`; `strict` refuses the extension keys
/// (`algorithm`, `burst`) as upstream would.
pub(super) struct RateLimitSeed {
    pub(super) strict: bool,
}

impl<'de> DeserializeSeed<'de> for RateLimitSeed {
    type Value = Option<Checked>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for RateLimitSeed {
    type Value = Option<Checked>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a rate_limit mapping")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut rl = RawRateLimit::default();
        let keys = Key {
            extension: !self.strict,
        };
        while let Some(key) = map.next_key_seed(keys)? {
            match key.as_str() {
                "requests_per_unit" => {
                    let n = map.next_value_seed(Whole(32))?;
                    rl.requests_per_unit = u32::try_from(n).unwrap_or(u32::MAX);
                }
                "unit" => rl.unit = map.next_value_seed(Text)?,
                "unlimited" => rl.unlimited = map.next_value_seed(Flag)?,
                "name" => rl.name = map.next_value_seed(Text)?,
                "replaces" => rl.replaces = map.next_value_seed(Replaces)?,
                "algorithm" | "burst" | "max_burst" if self.strict => {
                    return Err(unknown_key(&key))
                }
                "algorithm" => rl.algorithm = Some(map.next_value_seed(Text)?),
                "burst" | "max_burst" => {
                    if rl.burst.is_some() {
                        return Err(de::Error::custom(
                            "write `max_burst` alone (`burst` is its older spelling)",
                        ));
                    }
                    rl.burst = Some(map.next_value_seed(Whole(63))?);
                    rl.burst_key = if key == "burst" { "burst" } else { "max_burst" };
                }
                "concurrency" => {
                    return Err(de::Error::custom(
                        "concurrency cannot be expressed in the rate-limit protocol (it has no release call)",
                    ))
                }
                "metadata" => drop(map.next_value::<IgnoredAny>()?),
                k if VALID_KEYS.contains(&k) => map.next_value_seed(Unread)?,
                k => return Err(unknown_key(k)),
            }
        }
        rl.check().map(Some).map_err(de::Error::custom)
    }
}

/// `replaces: [{name: x}, ...]`.
struct Replaces;

impl<'de> DeserializeSeed<'de> for Replaces {
    type Value = Vec<String>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Replaces {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of `name:` mappings")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut names = Vec::new();
        while let Some(name) = seq.next_element_seed(ReplaceEntry)? {
            names.push(name);
        }
        Ok(names)
    }
}

struct ReplaceEntry;

impl<'de> DeserializeSeed<'de> for ReplaceEntry {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReplaceEntry {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a `name:` mapping")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut name = String::new();
        while let Some(key) = map.next_key_seed(KEY)? {
            match key.as_str() {
                "name" => name = map.next_value_seed(Text)?,
                "metadata" => drop(map.next_value::<IgnoredAny>()?),
                k if VALID_KEYS.contains(&k) => map.next_value_seed(Unread)?,
                k => return Err(unknown_key(k)),
            }
        }
        Ok(name)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Err(not_a_map(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Err(not_a_map(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Err(not_a_map(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Err(not_a_map("<nil>"))
    }
}
