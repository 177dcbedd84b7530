//! What a request without a key gets, and the answer's body and fields.

use http::StatusCode;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

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
