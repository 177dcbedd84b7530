//! What the layer does with a denial, a store failure, or a request without a key.

use std::time::Duration;

use http::StatusCode;

/// What happens to a request a rule denies.
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
///
/// let policy = Policy::token_bucket(10, 1.0)?;
/// // Hold a denied like for up to a second rather than refusing it.
/// let likes = ThrottleLayer::new(MemoryStore::new(), policy).delay_up_to(Duration::from_secs(1));
/// // Try a stricter limit on live traffic: headers and logs, no 429.
/// let trial = ThrottleLayer::new(MemoryStore::new(), policy).dry_run();
/// // Keep serving if the store is down, giving it 50 ms per check.
/// let lenient = ThrottleLayer::new(MemoryStore::new(), policy)
///     .fail_open()
///     .store_timeout(Duration::from_millis(50));
/// # let _ = (likes, trial, lenient);
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mode {
    /// Answer `429 Too Many Requests` (default).
    #[default]
    Reject,
    /// Wait for the quota, up to `max_wait` in all, then forward; answer 429
    /// when the wait would be longer (or the request can never fit).
    ///
    /// A request counted by one GCRA rule (cell, funnel, token bucket),
    /// beside any concurrency rules, reserves the next free slot within the
    /// remaining budget in the same store call: it then sleeps until its
    /// slot and is forwarded without checking again, so waiters queue behind
    /// each other instead of stampeding. Other requests sleep for the
    /// decision's `retry_after` and are checked again, at most
    /// [`MAX_DELAY_ATTEMPTS`] times; a request that loses the race for a
    /// freed slot waits again within the same budget. That includes requests
    /// counted by two or more rules (a global rule and a per-user one): a
    /// slot reserved in each rule would count the request at that rule's
    /// own slot while it runs at the latest one, letting another request run
    /// beside it where the rule allows one. On a store that cannot reserve
    /// ([`Store::reserves_slots`](crate::Store::reserves_slots): `CellStore`,
    /// `GovernorStore`) every waiter checks again.
    Delay {
        /// The longest a request is held before it is rejected.
        max_wait: Duration,
    },
    /// Evaluate, log, add headers and expose the decision, but never reject:
    /// to try a limit on production traffic.
    DryRun,
}

pub use crate::limiter::MAX_DELAY_ATTEMPTS;

/// What happens when the store fails or times out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailMode {
    /// Forward the request unlimited (availability first), with no
    /// rate-limit fields; its [`RateLimitInfo`](crate::RateLimitInfo), if
    /// requested, says so
    /// ([`NotLimited::StoreFailed`](crate::info::NotLimited::StoreFailed)).
    Open,
    /// Answer `503 Service Unavailable` (default: an attacker who can break
    /// the store does not get unlimited access).
    #[default]
    Closed,
}

/// What happens when a rule's key extractor finds no key the client should
/// have sent (no user, no credential, no header). Never a panic. To fall
/// back to another key instead, use
/// [`KeyExtractor::or`](crate::key::KeyExtractor::or).
///
/// A key the *server* cannot build (no peer address because the server was
/// not set up to record it, see
/// [`MissingKey::misconfigured`](crate::key::MissingKey::misconfigured)) is
/// not the client's fault: it is answered `500 Internal Server Error`
/// whatever this setting, with a body that says the rate limiting is
/// misconfigured and why, without internals; the fix is logged once.
///
/// ```
/// use http::StatusCode;
/// use tower_throttle::mode::OnMissingKey;
/// use tower_throttle::{key::BearerToken, MemoryStore, Policy, ThrottleLayer};
///
/// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::concurrency(2)?)
///     .key(BearerToken)
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED));
/// # let _ = layer;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Answer with this status and a body naming what was missing (default
    /// `401 Unauthorized`: the client did not identify itself).
    Reject(StatusCode),
    /// Do not apply that rule to the request (other rules still apply, and
    /// the rule is absent from its [`RateLimitInfo`](crate::RateLimitInfo)).
    /// A request no rule applies to is forwarded with no rate-limit fields,
    /// and its info says so
    /// ([`NotLimited::NoKey`](crate::info::NotLimited::NoKey)).
    Skip,
}

impl Default for OnMissingKey {
    fn default() -> Self {
        OnMissingKey::Reject(StatusCode::UNAUTHORIZED)
    }
}
