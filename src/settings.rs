//! What a layer was configured to do beyond its rules: the mode, the
//! store's failure handling, the responses and what admissions forward.

use std::sync::Arc;
use std::time::Duration;

use crate::grpc::ResponseProtocol;
use crate::key::RequestHead;
use crate::lockout::Penalty;
use crate::mode::{FailMode, Mode, OnMissingKey};
use crate::outcome::Outcome;
use crate::response::{BodyFormat, FieldSettings};
use crate::rule::RuleCfg;

/// A predicate of [`ThrottleLayer::count_if_outcome`](crate::ThrottleLayer::count_if_outcome)
/// (and of `count_if`, which sees the outcome's HTTP equivalent).
pub(crate) type CountIf = Arc<dyn Fn(Outcome) -> bool + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) mode: Mode,
    pub(crate) fail: FailMode,
    pub(crate) timeout: Option<Duration>,
    pub(crate) on_missing: OnMissingKey,
    pub(crate) body: BodyFormat,
    pub(crate) headers_on_allowed: bool,
    pub(crate) request_info: bool,
    /// Which rate-limit fields responses carry, and how.
    pub(crate) fields: FieldSettings,
    pub(crate) protocol: ResponseProtocol,
    /// Requests that bypass the layer.
    pub(crate) skip: Option<Skip>,
    /// Which responses keep their charge; the others are refunded.
    pub(crate) count_if: Option<CountIf>,
    /// Some rule settles its cost after the response (set when the
    /// layer builds its service).
    pub(crate) settles_cost: bool,
    /// Locks rule keys out after repeated denials.
    pub(crate) lockout: Option<Arc<Penalty>>,
    /// The share of a limit past which an admission counts as near it.
    #[cfg(feature = "metrics")]
    pub(crate) near_limit: f64,
}

/// A predicate of [`ThrottleLayer::skip_if`](crate::ThrottleLayer::skip_if).
pub(crate) type Skip = Arc<dyn Fn(&RequestHead<'_>) -> bool + Send + Sync>;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Reject,
            fail: FailMode::Closed,
            timeout: None,
            on_missing: OnMissingKey::default(),
            body: BodyFormat::PlainText,
            headers_on_allowed: false,
            request_info: false,
            fields: FieldSettings::default(),
            protocol: ResponseProtocol::default(),
            skip: None,
            count_if: None,
            settles_cost: false,
            lockout: None,
            #[cfg(feature = "metrics")]
            near_limit: DEFAULT_NEAR_LIMIT_RATIO,
        }
    }
}

/// The default [`ThrottleLayer::near_limit_ratio`](crate::ThrottleLayer::near_limit_ratio):
/// Envoy's rate-limit service's `NEAR_LIMIT_RATIO`.
#[cfg(feature = "metrics")]
pub(crate) const DEFAULT_NEAR_LIMIT_RATIO: f64 = 0.8;

impl Settings {
    /// Whether `rules` under these settings make a simple layer (see
    /// `LayerState::simple`).
    pub(crate) fn simple(&self, rules: &[RuleCfg]) -> bool {
        rules.len() == 1
            && self.skip.is_none()
            && self.lockout.is_none()
            && !matches!(self.mode, Mode::Delay { .. })
            && !self.info_on_allowed()
    }

    /// Whether an admission's figures (`remaining`, the resets) are read
    /// whatever the log level: by the near-limit count of the `metrics`
    /// feature, unless its ratio is 1 (nothing is counted then).
    pub(crate) fn counts_near_limit(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.near_limit < 1.0;
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// Whether an admitted request needs its [`RateLimitInfo`] (for the
    /// request extension or the response headers).
    pub(crate) fn info_on_allowed(&self) -> bool {
        let f = self.forwarding();
        f.headers || f.request_info || self.count_if.is_some() || self.settles_cost
    }

    /// What an admitted request carries forward.
    pub(crate) fn forwarding(&self) -> Forwarding {
        Forwarding {
            headers: self.headers_on_allowed || self.mode == Mode::DryRun,
            request_info: self.request_info,
        }
    }
}

/// What an admitted request carries forward.
#[derive(Clone, Copy)]
pub(crate) struct Forwarding {
    /// The response gets the rate-limit headers.
    pub(crate) headers: bool,
    /// The request gets the [`RateLimitInfo`] extension.
    pub(crate) request_info: bool,
}
