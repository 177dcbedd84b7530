//! What a layer file says, as serde reads it: every field named, unknown
//! ones refused, values checked as they are read (so an error carries the
//! line and the field of the value at fault).

use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::answer::{
    BodyConfig, FieldProfileConfig, OnMissingKeyConfig, QuotaUnitConfig, ResetFormatConfig,
};
use super::behaviour::{CountIfConfig, SkipConfig};
use super::cost::{CostConfig, SettleConfig};
use super::duration::{duration, optional_duration};
use super::key::KeyConfig;
use super::policy::PolicyConfig;
use super::tiers::TiersConfig;
use crate::limiter::valid_name;
use crate::lockout::Penalty;

/// A whole [`ThrottleLayer`](crate::ThrottleLayer): its rules and how it
/// answers. See the [module docs](super) for a file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerConfig {
    /// Put before every key (`prefix:rule:key`); none by default.
    #[serde(default)]
    pub prefix: Option<String>,
    /// The key of every rule without its own (default `peer_ip`).
    #[serde(default)]
    pub key: Option<KeyConfig>,
    /// What a denial does (default `reject`).
    #[serde(default)]
    pub mode: ModeConfig,
    /// What a store failure does (default `closed`: a 503).
    #[serde(default)]
    pub on_store_failure: FailConfig,
    /// How long a check may wait for the store (default: the store's own),
    /// above zero.
    #[serde(default, deserialize_with = "timeout")]
    pub store_timeout: Option<Duration>,
    /// Locks a key out after repeated denials.
    #[serde(default)]
    pub lockout: Option<LockoutConfig>,
    /// `RateLimit-Policy` / `RateLimit` on admitted responses too (default:
    /// only on 429s).
    #[serde(default)]
    pub headers_on_allowed: bool,
    /// [`RateLimitInfo`](crate::RateLimitInfo) in every forwarded request's
    /// extensions, for handlers (default off).
    #[serde(default)]
    pub request_info: bool,
    /// Requests let through without a check (by path or method).
    #[serde(default)]
    pub skip: Option<SkipConfig>,
    /// Which responses count; the others are refunded (default: all count).
    #[serde(default)]
    pub count_if: Option<CountIfConfig>,
    /// What a request without a rule's key gets (default `{ reject: 401 }`).
    #[serde(default)]
    pub on_missing_key: Option<OnMissingKeyConfig>,
    /// The share of a limit at which a check counts as near it (metrics),
    /// 0 to 1.
    #[serde(default, deserialize_with = "ratio")]
    pub near_limit_ratio: Option<f64>,
    /// The IETF `RateLimit-Policy` / `RateLimit` fields (default on).
    #[serde(default)]
    pub ietf_headers: Option<bool>,
    /// The draft the IETF fields follow (default `draft11`).
    #[serde(default)]
    pub field_profile: Option<FieldProfileConfig>,
    /// `X-RateLimit-Limit` / `-Remaining` / `-Reset` too (default off).
    #[serde(default)]
    pub legacy_headers: bool,
    /// How `X-RateLimit-Reset` says when (default `seconds`).
    #[serde(default)]
    pub legacy_reset_format: Option<ResetFormatConfig>,
    /// The 429's body (default `plain_text`).
    #[serde(default)]
    pub body: BodyConfig,
    /// Shares counters with another layer on the same names on purpose.
    #[serde(default)]
    pub share_counters: bool,
    /// The rules, all of which must admit a request; at least one.
    #[serde(deserialize_with = "rules")]
    pub rules: Vec<RuleConfig>,
}

/// One rule: a name, a policy, and optionally its own key and cost.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// 1 to 64 of `[A-Za-z0-9_.-]`; part of every key of the rule, so a
    /// rule keeps its counters across reloads while its name stays.
    #[serde(deserialize_with = "rule_name")]
    pub name: String,
    /// The limit.
    pub policy: PolicyConfig,
    /// Its own key, instead of the layer's.
    #[serde(default)]
    pub key: Option<KeyConfig>,
    /// Units a request costs: a number, or read from a header or query
    /// parameter (default 1).
    #[serde(default)]
    pub cost: Option<CostConfig>,
    /// Settles the actual cost after the response (the cost is then the
    /// estimate): see [`crate::meter`].
    #[serde(default)]
    pub settle: Option<SettleConfig>,
    /// What the quota counts, for the `qu` parameter.
    #[serde(default)]
    pub quota_unit: Option<QuotaUnitConfig>,
    /// A policy per value of a key (tiers).
    #[serde(default)]
    pub tiers: Option<TiersConfig>,
}

/// What a denial does.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ModeConfig {
    /// Answer 429 (gRPC: RESOURCE_EXHAUSTED).
    #[default]
    Reject,
    /// Decide, log and add headers, but let every request through.
    DryRun,
    /// Hold a denied request up to this long for its turn.
    DelayUpTo(#[serde(deserialize_with = "duration")] Duration),
}

/// What a store failure does.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailConfig {
    /// Answer 503.
    #[default]
    Closed,
    /// Let the request through unlimited.
    Open,
}

/// A [`Penalty`]: `strikes` denials within `within` lock a key for `lock`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockoutConfig {
    /// Denials that lock.
    pub strikes: u64,
    /// Within how long.
    #[serde(deserialize_with = "duration")]
    pub within: Duration,
    /// For how long.
    #[serde(deserialize_with = "duration")]
    pub lock: Duration,
}

impl LockoutConfig {
    pub(super) fn penalty(&self) -> Result<Penalty, String> {
        Penalty::new(self.strikes, self.within, self.lock).map_err(|e| e.to_string())
    }
}

/// A timeout above zero: one of 0 would fail every call through a future
/// (every Redis check) over to the fail mode.
fn timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match optional_duration(d)? {
        Some(Duration::ZERO) => Err(D::Error::custom(
            "a timeout of 0 would fail every store call: give one above zero, such as 50ms",
        )),
        t => Ok(t),
    }
}

fn ratio<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let r = f64::deserialize(d)?;
    if !(0.0..=1.0).contains(&r) {
        return Err(D::Error::custom(format_args!(
            "{r} is not a share from 0 to 1"
        )));
    }
    Ok(Some(r))
}

fn rule_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if !valid_name(&name) {
        return Err(D::Error::custom(format_args!(
            "rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
        )));
    }
    Ok(name)
}

fn rules<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RuleConfig>, D::Error> {
    let rules = Vec::<RuleConfig>::deserialize(d)?;
    if rules.is_empty() {
        return Err(D::Error::custom("a layer needs at least one rule"));
    }
    for (i, rule) in rules.iter().enumerate() {
        if rules[..i].iter().any(|r| r.name == rule.name) {
            return Err(D::Error::custom(format_args!(
                "two rules are named {:?}",
                rule.name
            )));
        }
    }
    Ok(rules)
}
