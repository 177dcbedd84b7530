//! What a loaded rule is: units, algorithms and limits.

use std::time::Duration;

use tower_throttle::{Policy, PolicyError};

/// A rate-limit unit: upstream's proto enum, with its epoch-aligned window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 604,800 s (windows start on Thursdays, 00:00 UTC, as the epoch did).
    Week,
    /// 30 days, not a calendar month.
    Month,
    /// 365 days, not a calendar year.
    Year,
}

impl Unit {
    /// The case-insensitive proto name (`minute`, `HOUR`); `UNKNOWN` and
    /// anything else are `None`.
    pub fn parse(name: &str) -> Option<Unit> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// From the proto enum value (`UNKNOWN` = 0 is `None`).
    pub fn from_proto(value: i32) -> Option<Unit> {
        const UNITS: [Unit; 7] = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        UNITS.into_iter().find(|u| u.proto() == value)
    }

    /// The proto enum value (the generated enum's, whose order is not the
    /// units' order: MONTH = 5, YEAR = 6, WEEK = 7).
    pub fn proto(self) -> i32 {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as Pb;
        (match self {
            Unit::Second => Pb::Second,
            Unit::Minute => Pb::Minute,
            Unit::Hour => Pb::Hour,
            Unit::Day => Pb::Day,
            Unit::Week => Pb::Week,
            Unit::Month => Pb::Month,
            Unit::Year => Pb::Year,
        }) as i32
    }

    /// The proto name, upper case.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// Upstream's `UnitToDivider`: the window in seconds.
    pub fn divider(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// [`Unit::divider`] as a duration.
    pub fn window(self) -> Duration {
        Duration::from_secs(self.divider())
    }
}

/// How a limit counts: upstream's fixed window, or one of the crate's
/// other algorithms (the `algorithm:` extension key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Upstream's counter per epoch-aligned window (the default).
    FixedWindow,
    /// Two window counters weighted by overlap.
    SlidingWindow,
    /// An exact log of admitted hits over the last unit.
    SlidingLog,
    /// GCRA (redis-cell's `CL.THROTTLE`): `burst` extra hits at once.
    Gcra {
        /// `max_burst`: hits admitted at once beyond the first.
        burst: u64,
    },
}

impl Algorithm {
    /// The name used in the YAML.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Gcra { .. } => "gcra",
        }
    }

    /// The crate policy for `requests_per_unit` per `unit` (`None` for a
    /// fixed window of 0, which is always over).
    pub fn policy(self, requests_per_unit: u32, unit: Unit) -> Result<Option<Policy>, PolicyError> {
        let n = u64::from(requests_per_unit);
        let w = unit.window();
        Ok(Some(match self {
            Algorithm::FixedWindow if n == 0 => return Ok(None),
            Algorithm::FixedWindow => Policy::fixed_window(n, w)?,
            Algorithm::SlidingWindow => Policy::sliding_window(n, w)?,
            Algorithm::SlidingLog => Policy::sliding_log(n, w)?,
            Algorithm::Gcra { burst } => Policy::cell(burst, n, w)?,
        }))
    }
}

/// A limit of the configuration (upstream's `RateLimit`).
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    /// The stats key: `domain.key_value.key2` along the config path.
    pub full_key: String,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`; `None` only when unlimited.
    pub unit: Option<Unit>,
    /// `unlimited: true`.
    pub unlimited: bool,
    /// `name`, for `replaces`.
    pub name: String,
    /// Names this limit replaces.
    pub replaces: Vec<String>,
    /// `shadow_mode` of the descriptor.
    pub shadow_mode: bool,
    /// `quota_mode` of the descriptor.
    pub quota_mode: bool,
    /// `detailed_metric` of the descriptor.
    pub detailed_metric: bool,
    /// The extension `algorithm` (default fixed window).
    pub algorithm: Algorithm,
    /// The crate policy; `None` when unlimited or a fixed window of 0.
    pub policy: Option<Policy>,
}
