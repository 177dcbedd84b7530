//! A `RateLimitRequest` checked and flattened: upstream's service errors,
//! and this server's bounds on what one request may hold.

use super::wire::WireRequest;

/// Bounds on one request (`RLS_MAX_*`).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Descriptors per request.
    pub max_descriptors: usize,
    /// Entries per descriptor.
    pub max_entries: usize,
    /// Bytes of one entry key or value.
    pub max_value_bytes: usize,
}

/// Why a request gets an error instead of an answer. The messages name
/// nothing internal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// Upstream: `rate limit domain must not be empty`.
    EmptyDomain,
    /// Upstream: `rate limit descriptor list must not be empty`.
    NoDescriptors,
    /// Upstream: `no rate limit configuration loaded`.
    NoConfig,
    /// More descriptors, entries or bytes than the bounds allow.
    TooLarge(String),
    /// A `limit` override whose unit is not a unit.
    BadOverrideUnit(i32),
    /// The store could not decide (details are logged, not returned).
    StoreUnavailable,
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::EmptyDomain => f.write_str("rate limit domain must not be empty"),
            RequestError::NoDescriptors => {
                f.write_str("rate limit descriptor list must not be empty")
            }
            RequestError::NoConfig => f.write_str("no rate limit configuration loaded"),
            RequestError::TooLarge(what) => write!(f, "request too large: {what}"),
            RequestError::BadOverrideUnit(unit) => {
                write!(f, "descriptor limit override has an invalid unit ({unit})")
            }
            RequestError::StoreUnavailable => f.write_str("rate limit store unavailable"),
        }
    }
}

impl std::error::Error for RequestError {}

/// One descriptor, flattened.
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// `(key, value)` pairs, as the bytes they came as (UTF-8 or not).
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// The request's `limit` override.
    pub override_limit: Option<(u32, i32)>,
    /// Hits to add (upstream's `GetHitsAddends`).
    pub hits: u64,
}

/// Checks `req` against upstream's rules and `bounds`, and flattens it
/// into its domain and descriptors.
pub fn check(req: WireRequest, bounds: Bounds) -> Result<(Vec<u8>, Vec<Descriptor>), RequestError> {
    if req.domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    if req.descriptors.is_empty() {
        return Err(RequestError::NoDescriptors);
    }
    if req.descriptors.len() > bounds.max_descriptors {
        return Err(RequestError::TooLarge(format!(
            "{} descriptors (at most {})",
            req.descriptors.len(),
            bounds.max_descriptors
        )));
    }
    if req.domain.len() > bounds.max_value_bytes {
        return Err(RequestError::TooLarge(format!(
            "a domain of more than {} bytes",
            bounds.max_value_bytes
        )));
    }
    let request_hits = u64::from(req.hits_addend.max(1));
    let mut out = Vec::with_capacity(req.descriptors.len());
    for d in req.descriptors {
        if d.entries.len() > bounds.max_entries {
            return Err(RequestError::TooLarge(format!(
                "a descriptor of {} entries (at most {})",
                d.entries.len(),
                bounds.max_entries
            )));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for e in d.entries {
            if e.key.len() > bounds.max_value_bytes || e.value.len() > bounds.max_value_bytes {
                return Err(RequestError::TooLarge(format!(
                    "an entry key or value of more than {} bytes",
                    bounds.max_value_bytes
                )));
            }
            entries.push((e.key, e.value));
        }
        out.push(Descriptor {
            entries,
            override_limit: d.limit.map(|l| (l.requests_per_unit, l.unit)),
            hits: d.hits_addend.map_or(request_hits, |h| h.value),
        });
    }
    Ok((req.domain, out))
}
