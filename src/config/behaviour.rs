//! Which outcomes count, and which requests skip the limits.

use std::fmt;
use std::sync::Arc;

use http::{Method, StatusCode};
use serde::de::{self, Error as _, Visitor};
use serde::{Deserialize, Deserializer};

use crate::grpc::GrpcCode;
use crate::key::RequestHead;
use crate::outcome::Outcome;

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
