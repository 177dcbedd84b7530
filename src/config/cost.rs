//! A request's cost: a number or read from the request, and where a
//! settled rule's actual cost comes from.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use serde::de::{self, Error as _, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::key::RequestHead;
use crate::meter::ActualCost;

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
