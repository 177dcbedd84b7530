//! What a layer file says beyond rules and keys: which outcomes count,
//! which requests skip the limits, costs from the request and from the
//! response, tiers of policies, missing keys and the answer's fields.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use http::{HeaderName, Method, StatusCode};
use serde::de::{self, Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::spec::{KeyConfig, PolicyConfig};
use crate::grpc::GrpcCode;
use crate::key::{KeyExtractor, KeyWriter, RequestHead};
use crate::meter::ActualCost;
use crate::outcome::Outcome;
use crate::policy::Policy;

/// Which responses count (the others are refunded once their outcome is
/// known): [`ThrottleLayer::count_if_outcome`](crate::ThrottleLayer::count_if_outcome).
///
/// ```yaml
/// count_if: { http: [401, 403, 5xx], grpc: [unauthenticated, permission_denied] }
/// ```
///
/// Without `grpc`, a gRPC call counts as its HTTP equivalent would
/// (`UNAUTHENTICATED` as a 401), as [`count_if`](crate::ThrottleLayer::count_if)
/// does; without `http`, every HTTP response counts.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CountIfConfig {
    /// Statuses (`401`) or classes (`4xx`, `5xx`) that count.
    #[serde(default)]
    pub http: Option<Vec<StatusMatch>>,
    /// gRPC codes that count, by name (`unauthenticated`) or number.
    #[serde(default)]
    pub grpc: Option<Vec<GrpcCodeConfig>>,
}

impl CountIfConfig {
    pub(super) fn counts(&self) -> impl Fn(Outcome) -> bool + Send + Sync + 'static {
        let http = self.http.clone();
        let grpc = self.grpc.clone();
        move |outcome| {
            let http_counts = |status: StatusCode| {
                http.as_ref()
                    .is_none_or(|list| list.iter().any(|m| m.matches(status)))
            };
            match (outcome, &grpc) {
                (Outcome::Grpc(code), Some(codes)) => codes.iter().any(|c| c.0 == code),
                (Outcome::Grpc(code), None) => http_counts(code.http_equivalent()),
                (Outcome::Http(status), _) => http_counts(status),
            }
        }
    }
}

/// An HTTP status, or a class of them (`4xx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusMatch {
    /// This status.
    Exact(StatusCode),
    /// Every status of this hundred (`4` for `4xx`).
    Class(u16),
}

impl StatusMatch {
    fn matches(self, status: StatusCode) -> bool {
        match self {
            StatusMatch::Exact(s) => s == status,
            StatusMatch::Class(c) => status.as_u16() / 100 == c,
        }
    }
}

impl<'de> Deserialize<'de> for StatusMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StatusMatch;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an HTTP status (401) or a class (4xx)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<StatusMatch, E> {
                let status = u16::try_from(n)
                    .ok()
                    .and_then(|n| StatusCode::from_u16(n).ok());
                status
                    .map(StatusMatch::Exact)
                    .ok_or_else(|| E::custom(format_args!("{n} is not an HTTP status")))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<StatusMatch, E> {
                let n = u64::try_from(n).map_err(|_| E::custom("a status is positive"))?;
                self.visit_u64(n)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StatusMatch, E> {
                match s.as_bytes() {
                    [c @ b'1'..=b'5', b'x' | b'X', b'x' | b'X'] => {
                        Ok(StatusMatch::Class(u16::from(c - b'0')))
                    }
                    _ => match s.parse::<u64>() {
                        Ok(n) => self.visit_u64(n),
                        Err(_) => Err(E::custom(format_args!(
                            "{s:?} is not an HTTP status (401) or a class (1xx to 5xx)"
                        ))),
                    },
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A gRPC status code, by its name in any case (`unauthenticated`,
/// `PERMISSION_DENIED`) or its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcCodeConfig(pub GrpcCode);

const GRPC_NAMES: [&str; 17] = [
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

impl<'de> Deserialize<'de> for GrpcCodeConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GrpcCodeConfig;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a gRPC code: a name (unauthenticated) or 0 to 16")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<GrpcCodeConfig, E> {
                match i32::try_from(n) {
                    Ok(n @ 0..=16) => Ok(GrpcCodeConfig(GrpcCode::from_i32(n))),
                    _ => Err(E::custom(format_args!("{n} is not a gRPC code (0 to 16)"))),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<GrpcCodeConfig, E> {
                let n = u64::try_from(n).map_err(|_| E::custom("a gRPC code is 0 to 16"))?;
                self.visit_u64(n)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<GrpcCodeConfig, E> {
                let lower = s.to_ascii_lowercase();
                match GRPC_NAMES.iter().position(|n| *n == lower) {
                    Some(i) => Ok(GrpcCodeConfig(GrpcCode::from_i32(i as i32))),
                    None => Err(E::custom(format_args!("{s:?} is not a gRPC code name"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Requests the layer lets through without a check:
/// [`ThrottleLayer::skip_if`](crate::ThrottleLayer::skip_if).
///
/// ```yaml
/// skip: { paths: [/healthz, /metrics/*], methods: [OPTIONS] }
/// ```
///
/// Paths match exactly, or by prefix when they end in `*`. Nothing a
/// client can set at will (a header) skips the limits.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipConfig {
    /// Paths (`/healthz`) or path prefixes (`/metrics/*`).
    #[serde(default, deserialize_with = "paths")]
    pub paths: Vec<String>,
    /// Methods (`OPTIONS`).
    #[serde(default, deserialize_with = "methods")]
    pub methods: Vec<Method>,
}

impl SkipConfig {
    pub(super) fn skips(&self) -> impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static {
        let paths: Arc<[String]> = self.paths.clone().into();
        let methods: Arc<[Method]> = self.methods.clone().into();
        move |req| {
            let path = req.uri().path();
            methods.contains(req.method())
                || paths.iter().any(|p| match p.strip_suffix('*') {
                    Some(prefix) => path.starts_with(prefix),
                    None => path == p,
                })
        }
    }
}

fn paths<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let paths = Vec::<String>::deserialize(d)?;
    match paths.iter().find(|p| !p.starts_with('/')) {
        Some(bad) => Err(D::Error::custom(format_args!(
            "path {bad:?} must start with `/`"
        ))),
        None => Ok(paths),
    }
}

fn methods<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Method>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|m| {
            Method::from_bytes(m.as_bytes())
                .map_err(|_| D::Error::custom(format_args!("{m:?} is not a method")))
        })
        .collect()
}

/// A request's cost: a number, or read from the request.
///
/// ```yaml
/// cost: 2
/// cost: { header: x-max-tokens, default: 256 }
/// cost: { query: max_tokens, default: 256 }
/// ```
///
/// A value that is absent or not a whole number costs `default`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CostConfig {
    /// Every request costs this.
    Fixed(u64),
    /// The value of this request header.
    Header {
        /// The header.
        name: HeaderName,
        /// The cost when the header is absent or not a number.
        default: u64,
    },
    /// The value of this query parameter.
    Query {
        /// The parameter.
        name: String,
        /// The cost when the parameter is absent or not a number.
        default: u64,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CostFrom {
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    query: Option<String>,
    default: u64,
}

impl<'de> Deserialize<'de> for CostConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CostConfig;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a number, or { header: NAME, default: N } or { query: NAME, default: N }",
                )
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<CostConfig, E> {
                Ok(CostConfig::Fixed(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<CostConfig, E> {
                u64::try_from(n)
                    .map(CostConfig::Fixed)
                    .map_err(|_| E::custom("a cost is 0 or more"))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<CostConfig, A::Error> {
                let from = CostFrom::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match (from.header, from.query) {
                    (Some(h), None) => HeaderName::from_bytes(h.as_bytes())
                        .map(|name| CostConfig::Header {
                            name,
                            default: from.default,
                        })
                        .map_err(|_| A::Error::custom(format_args!("{h:?} is not a header name"))),
                    (None, Some(q)) if !q.is_empty() => Ok(CostConfig::Query {
                        name: q,
                        default: from.default,
                    }),
                    _ => Err(A::Error::custom("name one of `header` or `query`")),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl CostConfig {
    /// The cost of a request, for [`Rule::cost_fn`](crate::Rule::cost_fn).
    pub(super) fn cost_fn(
        &self,
    ) -> Option<impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static> {
        let read: Arc<ReadCost> = match self {
            CostConfig::Fixed(_) => return None,
            CostConfig::Header { name, .. } => {
                let name = name.clone();
                Arc::new(move |req| req.headers().get(&name)?.to_str().ok()?.trim().parse().ok())
            }
            CostConfig::Query { name, .. } => {
                let name = name.clone();
                Arc::new(move |req| {
                    let query = req.uri().query()?;
                    query.split('&').find_map(|pair| {
                        let (k, v) = pair.split_once('=')?;
                        (k == name).then(|| v.parse().ok()).flatten()
                    })
                })
            }
        };
        let default = match self {
            CostConfig::Header { default, .. } | CostConfig::Query { default, .. } => *default,
            CostConfig::Fixed(n) => *n,
        };
        Some(move |req: &RequestHead<'_>| read(req).unwrap_or(default))
    }
}

/// Reads a request's cost, if it states one.
type ReadCost = dyn Fn(&RequestHead<'_>) -> Option<u64> + Send + Sync;

/// Where a settled rule's actual cost comes from ([`ActualCost`]).
///
/// ```yaml
/// settle: reported               # a ReportedCost the handler sets
/// settle: response_bytes
/// settle: { trailer: x-usage-tokens }
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SettleConfig {
    /// [`ActualCost::Reported`].
    Reported,
    /// [`ActualCost::ResponseBytes`].
    ResponseBytes,
    /// [`ActualCost::Trailer`].
    Trailer(#[serde(deserialize_with = "header_name")] HeaderName),
}

impl SettleConfig {
    pub(super) fn actual(&self) -> ActualCost {
        match self {
            SettleConfig::Reported => ActualCost::Reported,
            SettleConfig::ResponseBytes => ActualCost::ResponseBytes,
            SettleConfig::Trailer(name) => ActualCost::Trailer(name.clone()),
        }
    }
}

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<HeaderName, D::Error> {
    let name = String::deserialize(d)?;
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| D::Error::custom(format_args!("{name:?} is not a header name")))
}

/// A policy per value of a key: tiers ([`Rule::policy_fn`](crate::Rule::policy_fn)).
///
/// ```yaml
/// tiers:
///   by: { extractor: plan }      # or { header: x-plan }, ...
///   policies:
///     pro: { sliding_window: { limit: 50, window: 60s } }
///     team: { sliding_window: { limit: 500, window: 60s } }
/// ```
///
/// A request whose value is not listed (or that has none) gets the rule's
/// own policy. Take the value from something the client cannot choose (an
/// extension your authentication sets, through a registered extractor).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TiersConfig {
    /// The key whose value picks the tier.
    pub by: KeyConfig,
    /// The policy of each value.
    pub policies: BTreeMap<String, PolicyConfig>,
}

impl TiersConfig {
    pub(super) fn policy_fn(
        &self,
        by: Arc<dyn KeyExtractor>,
    ) -> impl Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync + 'static {
        let policies: BTreeMap<Vec<u8>, Policy> = (self.policies.iter())
            .map(|(value, p)| (value.as_bytes().to_vec(), p.0))
            .collect();
        move |req| {
            let mut value = Vec::new();
            by.extract(req, &mut KeyWriter::new(&mut value)).ok()?;
            policies.get(&value).copied()
        }
    }
}

/// What a request without a rule's key gets:
/// [`OnMissingKey`](crate::mode::OnMissingKey).
///
/// ```yaml
/// on_missing_key: skip
/// on_missing_key: { reject: 401 }
/// ```
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum OnMissingKeyConfig {
    /// Answer with this status.
    Reject(#[serde(deserialize_with = "status")] StatusCode),
    /// Do not apply the rule.
    Skip,
}

fn status<'de, D: Deserializer<'de>>(d: D) -> Result<StatusCode, D::Error> {
    let n = u16::deserialize(d)?;
    StatusCode::from_u16(n)
        .ok()
        .filter(|s| s.is_client_error() || s.is_server_error())
        .ok_or_else(|| D::Error::custom(format_args!("{n} is not a 4xx or 5xx status")))
}

/// The body of a 429.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyConfig {
    /// A line of text (the default).
    #[default]
    PlainText,
    /// RFC 9457 `application/problem+json`.
    ProblemJson,
}

/// The `RateLimit` fields' draft ([`FieldProfile`](crate::response::FieldProfile)).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldProfileConfig {
    /// draft-ietf-httpapi-ratelimit-headers-10.
    Draft10,
    /// draft-ietf-httpapi-ratelimit-headers-11.
    Draft11,
}

impl FieldProfileConfig {
    pub(super) fn profile(self) -> crate::response::FieldProfile {
        match self {
            FieldProfileConfig::Draft10 => crate::response::FieldProfile::Draft10,
            FieldProfileConfig::Draft11 => crate::response::FieldProfile::Draft11,
        }
    }
}

/// How `X-RateLimit-Reset` says when ([`ResetFormat`](crate::response::ResetFormat)).
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetFormatConfig {
    /// Seconds from now.
    Seconds,
    /// A Unix timestamp.
    UnixTimestamp,
}

impl ResetFormatConfig {
    pub(super) fn format(self) -> crate::response::ResetFormat {
        match self {
            ResetFormatConfig::Seconds => crate::response::ResetFormat::Seconds,
            ResetFormatConfig::UnixTimestamp => crate::response::ResetFormat::UnixTimestamp,
        }
    }
}

/// What a rule's quota counts ([`QuotaUnit`](crate::response::QuotaUnit)),
/// by its registered name.
#[derive(Clone, Copy, Debug, Deserialize)]
pub enum QuotaUnitConfig {
    /// `requests`.
    #[serde(rename = "requests")]
    Requests,
    /// `content-bytes`.
    #[serde(rename = "content-bytes")]
    ContentBytes,
    /// `concurrent-requests`.
    #[serde(rename = "concurrent-requests")]
    ConcurrentRequests,
}

impl QuotaUnitConfig {
    pub(super) fn unit(self) -> crate::response::QuotaUnit {
        match self {
            QuotaUnitConfig::Requests => crate::response::QuotaUnit::Requests,
            QuotaUnitConfig::ContentBytes => crate::response::QuotaUnit::ContentBytes,
            QuotaUnitConfig::ConcurrentRequests => crate::response::QuotaUnit::ConcurrentRequests,
        }
    }
}
