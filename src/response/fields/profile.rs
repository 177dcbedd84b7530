//! Which revision of the IETF draft a layer writes, and the quota units its
//! `qu` parameter names.

/// The revision of draft-ietf-httpapi-ratelimit-headers whose
/// `RateLimit-Policy` and `RateLimit` fields a layer writes
/// ([`ThrottleLayer::field_profile`](crate::ThrottleLayer::field_profile)).
///
/// Both revisions define the same fields and parameters: `RateLimit-Policy`
/// items `"name";q=<quota>;qu=<unit>;w=<window seconds>;pk=<partition key>`
/// and `RateLimit` items `"name";r=<units>;t=<seconds>;pk=<partition key>`,
/// and the same problem type, `quota-exceeded` with `violated-policies`.
/// -11 renamed, in prose only, `r` from "remaining" to "available quota"
/// and `t` from "reset" to "effective window", so that no periodic reset is
/// implied; the values are computed alike. A later revision that renames a
/// parameter becomes a variant here and leaves the other profiles unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FieldProfile {
    /// draft-ietf-httpapi-ratelimit-headers-10 (27 September 2025).
    Draft10,
    /// draft-ietf-httpapi-ratelimit-headers-11 (23 May 2026), the latest
    /// published revision: the default.
    #[default]
    Draft11,
}

impl FieldProfile {
    /// The draft's name, e.g. `draft-ietf-httpapi-ratelimit-headers-11`.
    pub fn draft(self) -> &'static str {
        match self {
            FieldProfile::Draft10 => "draft-ietf-httpapi-ratelimit-headers-10",
            FieldProfile::Draft11 => "draft-ietf-httpapi-ratelimit-headers-11",
        }
    }

    /// The parameter names this revision defines.
    pub(crate) fn params(self) -> &'static Params {
        match self {
            FieldProfile::Draft10 | FieldProfile::Draft11 => &DRAFT_10_11,
        }
    }
}

/// The parameter names of one revision.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// `RateLimit-Policy`: the quota.
    pub(crate) quota: &'static str,
    /// `RateLimit-Policy`: the quota unit.
    pub(crate) quota_unit: &'static str,
    /// `RateLimit-Policy`: the window, in seconds.
    pub(crate) window: &'static str,
    /// `RateLimit`: the units available now.
    pub(crate) remaining: &'static str,
    /// `RateLimit`: seconds until more quota is made available.
    pub(crate) reset: &'static str,
    /// Both fields: the partition key, a byte sequence.
    pub(crate) partition_key: &'static str,
}

const DRAFT_10_11: Params = Params {
    quota: "q",
    quota_unit: "qu",
    window: "w",
    remaining: "r",
    reset: "t",
    partition_key: "pk",
};

/// What a rule's quota counts: the `qu` parameter of its
/// `RateLimit-Policy` item, from the draft's RateLimit Quota Units
/// registry. Set with [`Rule::quota_unit`](crate::Rule::quota_unit);
/// without it, a concurrency policy counts
/// [`ConcurrentRequests`](QuotaUnit::ConcurrentRequests) and every other
/// policy [`Requests`](QuotaUnit::Requests).
///
/// `requests` is the draft's default unit and is never written; the others
/// are (`qu="content-bytes"`). The unit only describes the quota: what a
/// request costs is still its rule's cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuotaUnit {
    /// Requests processed (`qu` omitted: the draft's default).
    Requests,
    /// Content bytes processed (`qu="content-bytes"`).
    ContentBytes,
    /// Requests in progress at once (`qu="concurrent-requests"`).
    ConcurrentRequests,
}

impl QuotaUnit {
    /// The registered name: `requests`, `content-bytes` or
    /// `concurrent-requests`.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaUnit::Requests => "requests",
            QuotaUnit::ContentBytes => "content-bytes",
            QuotaUnit::ConcurrentRequests => "concurrent-requests",
        }
    }

    /// The unit a rule announces: `unit` if set, else what `policy` counts.
    pub(crate) fn of(unit: Option<QuotaUnit>, policy: &crate::Policy) -> QuotaUnit {
        unit.unwrap_or(if policy.is_concurrency() {
            QuotaUnit::ConcurrentRequests
        } else {
            QuotaUnit::Requests
        })
    }
}
