//! What a layer file says, as serde reads it: every field named, unknown
//! ones refused, values checked as they are read (so an error carries the
//! line and the field of the value at fault).

use std::sync::Arc;
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::behaviour::{
    BodyConfig, CostConfig, CountIfConfig, FieldProfileConfig, OnMissingKeyConfig, QuotaUnitConfig,
    ResetFormatConfig, SettleConfig, SkipConfig, TiersConfig,
};
use super::duration::parse_duration;
use crate::key::{
    BearerToken, Cidr, ClientIp, ForwardedHeader, Global, GrpcMethod, HeaderKey, KeyExtractor, Or,
    PeerIp, UriPath,
};
use crate::limiter::valid_name;
use crate::lockout::Penalty;
use crate::policy::Policy;

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
    /// How long a check may wait for the store (default: the store's own).
    #[serde(default, deserialize_with = "optional_duration")]
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

/// A policy: one key naming the algorithm, holding its parameters.
///
/// ```yaml
/// policy: { sliding_log: { limit: 5, window: 60s } }
/// policy: { cell: { max_burst: 15, count: 30, period: 1h } }
/// ```
///
/// `cell` takes redis-cell's `CL.THROTTLE` arguments: `max_burst` requests
/// beyond the first are admitted at once (16 here), then `count` per
/// `period`. The older spelling `burst` is read the same way, with a
/// warning: it was taken for the number admitted at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig(pub Policy);

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum PolicySpec {
    Cell(CellSpec),
    TokenBucket(BucketSpec),
    Funnel(BucketSpec),
    SlidingLog(WindowSpec),
    FixedWindow(WindowSpec),
    SlidingWindow(WindowSpec),
    Concurrency(ConcurrencySpec),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CellSpec {
    #[serde(default)]
    max_burst: Option<u64>,
    /// The older spelling of `max_burst`.
    #[serde(default)]
    burst: Option<u64>,
    count: u64,
    #[serde(deserialize_with = "duration")]
    period: Duration,
}

impl CellSpec {
    /// `max_burst`, or `burst` with a warning; not both.
    fn max_burst<E: serde::de::Error>(&self) -> Result<u64, E> {
        match (self.max_burst, self.burst) {
            (Some(n), None) => Ok(n),
            (None, Some(n)) => {
                tracing::warn!(
                    target: "tower_throttle",
                    burst = n,
                    "a `cell` policy's `burst` is redis-cell's max_burst: {} requests are admitted at once; write `max_burst: {n}` to say so",
                    n.saturating_add(1)
                );
                Ok(n)
            }
            (Some(_), Some(_)) => Err(E::custom(
                "write `max_burst` alone (`burst` is its older spelling)",
            )),
            (None, None) => Err(E::missing_field("max_burst")),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketSpec {
    capacity: u64,
    per_second: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowSpec {
    limit: u64,
    #[serde(deserialize_with = "duration")]
    window: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConcurrencySpec {
    max_in_flight: u64,
    #[serde(default, deserialize_with = "optional_duration")]
    lease: Option<Duration>,
}

impl<'de> Deserialize<'de> for PolicyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let policy = match PolicySpec::deserialize(d)? {
            PolicySpec::Cell(c) => Policy::cell(c.max_burst::<D::Error>()?, c.count, c.period),
            PolicySpec::TokenBucket(b) => Policy::token_bucket(b.capacity, b.per_second),
            PolicySpec::Funnel(b) => Policy::funnel(b.capacity, b.per_second),
            PolicySpec::SlidingLog(w) => Policy::sliding_log(w.limit, w.window),
            PolicySpec::FixedWindow(w) => Policy::fixed_window(w.limit, w.window),
            PolicySpec::SlidingWindow(w) => Policy::sliding_window(w.limit, w.window),
            PolicySpec::Concurrency(c) => match c.lease {
                Some(lease) => Policy::concurrency_with_lease(c.max_in_flight, lease),
                None => Policy::concurrency(c.max_in_flight),
            },
        };
        policy.map(PolicyConfig).map_err(D::Error::custom)
    }
}

/// Where a rule's key comes from.
///
/// ```yaml
/// key: peer_ip
/// key: { header: x-user-id }
/// key: { client_ip: { trust: [10.0.0.0/8], header: forwarded } }
/// key: { first_of: [bearer_token, peer_ip] }
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum KeyConfig {
    /// One key for everyone ([`Global`]).
    Global,
    /// The peer's address ([`PeerIp`]).
    PeerIp,
    /// The client's address behind trusted proxies ([`ClientIp`]).
    ClientIp(ClientIpConfig),
    /// A hash of the bearer token ([`BearerToken`]).
    BearerToken,
    /// A request header's value ([`HeaderKey`]).
    Header(#[serde(deserialize_with = "header_name")] http::HeaderName),
    /// The request path ([`UriPath::full`]).
    UriPath,
    /// The gRPC method ([`GrpcMethod`]).
    GrpcMethod,
    /// The first of these keys that the request has ([`Or`]).
    FirstOf(#[serde(deserialize_with = "some_keys")] Vec<KeyConfig>),
    /// An extractor the application registered under this name
    /// ([`Extractors`](super::Extractors)): a user id from a request
    /// extension, say.
    Extractor(String),
}

/// [`ClientIp`]'s settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientIpConfig {
    /// Proxies whose forwarding headers are believed (CIDRs).
    #[serde(default, deserialize_with = "cidrs")]
    pub trust: Vec<Cidr>,
    /// The header they set (default `x_forwarded_for`; also `forwarded`,
    /// `x_real_ip`, `cf_connecting_ip`, `true_client_ip`, `fly_client_ip`, …).
    #[serde(default)]
    pub header: Option<ForwardedHeader>,
}

impl KeyConfig {
    /// The extractor this describes; errs on a name `extractors` lacks.
    pub(super) fn extractor(
        &self,
        extractors: &super::Extractors,
    ) -> Result<Arc<dyn KeyExtractor>, String> {
        Ok(match self {
            KeyConfig::Extractor(name) => extractors.get(name)?,
            KeyConfig::Global => Arc::new(Global),
            KeyConfig::PeerIp => Arc::new(PeerIp::new()),
            KeyConfig::ClientIp(c) => {
                let mut ip = ClientIp::new().trust_all(c.trust.iter().copied());
                if let Some(header) = c.header {
                    ip = ip.header(header);
                }
                Arc::new(ip)
            }
            KeyConfig::BearerToken => Arc::new(BearerToken),
            KeyConfig::Header(name) => Arc::new(HeaderKey::new(name.clone())),
            KeyConfig::UriPath => Arc::new(UriPath::full()),
            KeyConfig::GrpcMethod => Arc::new(GrpcMethod::default()),
            KeyConfig::FirstOf(keys) => {
                let keys: Vec<_> = (keys.iter().rev())
                    .map(|k| k.extractor(extractors))
                    .collect::<Result<_, _>>()?;
                let mut keys = keys.into_iter();
                let last = keys.next().unwrap_or_else(|| Arc::new(Global));
                keys.fold(last, |chain, key| Arc::new(Or::new(key, chain)))
            }
        })
    }
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

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map_err(D::Error::custom)
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

fn optional_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
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

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<http::HeaderName, D::Error> {
    let name = String::deserialize(d)?;
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| D::Error::custom(format_args!("{name:?} is not a header name")))
}

fn cidrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|range| {
            range
                .parse()
                .map_err(|e| D::Error::custom(format_args!("{range:?} is not a CIDR: {e}")))
        })
        .collect()
}

fn some_keys<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<KeyConfig>, D::Error> {
    let keys = Vec::<KeyConfig>::deserialize(d)?;
    if keys.is_empty() {
        return Err(D::Error::custom("`first_of` needs at least one key"));
    }
    Ok(keys)
}
