//! What a layer decided for one request, for headers and for handlers:
//! [`RateLimitInfo`], and [`NotLimited`] for a request it let through
//! without checking. (The root re-exports `RateLimitInfo`; this module is
//! public so the path axum prints for a missing extension is one you can
//! write.)

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::decision::{DecidedBy, Decision};
use crate::policy::Policy;

/// What every rule of a layer decided for one request.
///
/// With [`request_info(true)`](crate::ThrottleLayer::request_info) every
/// request the layer forwards carries one in its extensions (axum:
/// `Extension<RateLimitInfo>`), so handlers can read each rule's
/// [`Decision`] and the binding one ([`RateLimitInfo::decision`]). A
/// request the layer let through unchecked carries one too, saying why
/// ([`RateLimitInfo::not_limited`]): it has no decision, and its response
/// gets no rate-limit fields. In [dry-run](crate::Mode::DryRun) mode,
/// [`RateLimitInfo::allowed`] tells whether the request would have been
/// rejected. When layers are nested, a handler sees the innermost layer's
/// that checked the request (an unchecked info only if none did).
///
/// ```
/// use axum::{routing::get, Extension, Router};
/// use tower_throttle::{MemoryStore, Policy, RateLimitInfo, ThrottleLayer};
///
/// async fn handler(Extension(info): Extension<RateLimitInfo>) -> String {
///     match info.decision() {
///         Some(d) => format!("{} left", d.remaining),
///         None => format!("not limited: {:?}", info.not_limited()),
///     }
/// }
///
/// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(10, std::time::Duration::from_secs(60))?)
///     .request_info(true)
///     // Health checks pass unchecked, and still carry their info.
///     .skip_if(|req| req.uri().path() == "/health");
/// let app: Router = Router::new().route("/", get(handler)).route("/health", get(handler)).layer(layer);
/// # let _ = app;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct RateLimitInfo {
    meta: Arc<Meta>,
    entries: Entries,
}

/// Why a layer forwarded a request without checking it: the
/// [`RateLimitInfo`] of such a request has no decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NotLimited {
    /// The layer's [`skip_if`](crate::ThrottleLayer::skip_if) matched it.
    Skipped,
    /// No rule found its key and the layer lets such requests through
    /// ([`OnMissingKey::Skip`](crate::mode::OnMissingKey::Skip)).
    NoKey,
    /// The store failed and the layer fails open
    /// ([`FailMode::Open`](crate::FailMode::Open)).
    StoreFailed,
}

/// Per-layer data the headers need, shared by every request: built by
/// `response::layer_meta` when the layer builds its
/// service (this module renders nothing).
pub(crate) struct Meta {
    pub(crate) rules: Box<[RuleSummary]>,
    /// `RateLimit-Policy`, rendered once.
    pub(crate) policy_header: Option<HeaderValue>,
    pub(crate) ietf_headers: bool,
    pub(crate) legacy_headers: bool,
    /// How `X-RateLimit-Reset` is written.
    pub(crate) legacy_reset: crate::response::fields::ResetFormat,
    /// The draft revision the IETF fields follow.
    pub(crate) profile: crate::response::fields::FieldProfile,
    /// Hashes rule keys into `pk` parameters, when enabled.
    pub(crate) partition: Option<crate::response::fields::PartitionKeys>,
    /// The fields of a plain-text 429, prebuilt (see `response`).
    pub(crate) limited: crate::response::fields::LimitedFields,
}

pub(crate) struct RuleSummary {
    pub(crate) name: Arc<str>,
    pub(crate) policy: Policy,
    /// The unit its `RateLimit-Policy` item names, if set.
    pub(crate) unit: Option<crate::response::fields::QuotaUnit>,
    /// This rule's `RateLimit` items of a 429, prebuilt.
    pub(crate) exhausted: crate::response::fields::ExhaustedItems,
}

#[derive(Clone)]
enum Entries {
    One(RuleDecision),
    Many(Vec<RuleDecision>),
    /// No rule was checked.
    None(NotLimited),
}

#[derive(Clone, Copy)]
pub(crate) struct RuleDecision {
    pub(crate) rule: usize,
    /// The policy applied: the rule's own, or the request's.
    pub(crate) policy: Policy,
    pub(crate) decision: Decision,
    /// The `pk` of the rule's key, when the layer writes them.
    pub(crate) pk: Option<crate::response::fields::Pk>,
}

impl RateLimitInfo {
    pub(crate) fn one(meta: Arc<Meta>, entry: RuleDecision) -> Self {
        RateLimitInfo {
            meta,
            entries: Entries::One(entry),
        }
    }

    pub(crate) fn many(meta: Arc<Meta>, entries: Vec<RuleDecision>) -> Self {
        RateLimitInfo {
            meta,
            entries: Entries::Many(entries),
        }
    }

    /// The info of a request forwarded unchecked (no allocation: the meta
    /// is shared).
    pub(crate) fn unchecked(meta: Arc<Meta>, why: NotLimited) -> Self {
        RateLimitInfo {
            meta,
            entries: Entries::None(why),
        }
    }

    pub(crate) fn meta(&self) -> &Meta {
        &self.meta
    }

    pub(crate) fn entries_mut(&mut self) -> &mut [RuleDecision] {
        match &mut self.entries {
            Entries::One(e) => std::slice::from_mut(e),
            Entries::Many(v) => v,
            Entries::None(_) => &mut [],
        }
    }

    pub(crate) fn entries(&self) -> &[RuleDecision] {
        match &self.entries {
            Entries::One(e) => std::slice::from_ref(e),
            Entries::Many(v) => v,
            Entries::None(_) => &[],
        }
    }

    /// True when the layer checked the request against its rules; false
    /// when it let the request through unchecked (see
    /// [`RateLimitInfo::not_limited`]).
    pub fn is_limited(&self) -> bool {
        !matches!(self.entries, Entries::None(_))
    }

    /// Why the layer let the request through unchecked; `None` when its
    /// rules decided.
    pub fn not_limited(&self) -> Option<NotLimited> {
        match self.entries {
            Entries::None(why) => Some(why),
            _ => None,
        }
    }

    /// True when every rule admitted the request (and when none was
    /// checked).
    pub fn allowed(&self) -> bool {
        self.entries().iter().all(|e| e.decision.allowed)
    }

    /// Each rule's name, the policy applied to this request (the rule's
    /// own, or one chosen per request: see [`crate::resolve`]) and decision
    /// (rules skipped for want of a key are absent; none when the request
    /// was [not limited](RateLimitInfo::not_limited)).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Policy, &Decision)> + '_ {
        self.entries()
            .iter()
            .map(|e| (&*self.meta.rules[e.rule].name, &e.policy, &e.decision))
    }

    /// The policy applied to the rule named `name` for this request.
    pub fn policy(&self, name: &str) -> Option<&Policy> {
        self.iter().find(|(n, _, _)| *n == name).map(|(_, p, _)| p)
    }

    /// True when some rule applied a policy other than its own.
    pub(crate) fn per_request_policy(&self) -> bool {
        self.entries()
            .iter()
            .any(|e| e.policy != self.meta.rules[e.rule].policy)
    }

    /// The decision of the rule named `name`.
    pub fn get(&self, name: &str) -> Option<&Decision> {
        self.iter().find(|(n, _, _)| *n == name).map(|(_, _, d)| d)
    }

    /// The binding decision: the denial with the longest wait ("never" is
    /// longest) if any rule denied, else the rule with the least remaining.
    /// `None` when the request was [not limited](RateLimitInfo::not_limited).
    pub fn decision(&self) -> Option<Decision> {
        self.is_limited().then(|| self.binding().decision)
    }

    /// The binding rule of a checked request (see [`RateLimitInfo::decision`]).
    pub(crate) fn binding(&self) -> &RuleDecision {
        let entries = self.entries();
        let denied = entries
            .iter()
            .filter(|e| !e.decision.allowed)
            .max_by_key(|e| e.decision.retry_after.unwrap_or(Duration::MAX));
        denied.unwrap_or_else(|| {
            entries
                .iter()
                .min_by_key(|e| e.decision.remaining)
                .expect("at least one rule was checked")
        })
    }

    /// Which store decided: [`DecidedBy::Fallback`] when any rule was
    /// decided by the fallback of a
    /// [`FallbackStore`](crate::store::FallbackStore) (its primary was
    /// unavailable), else [`DecidedBy::Primary`].
    pub fn decided_by(&self) -> DecidedBy {
        if self
            .entries()
            .iter()
            .any(|e| e.decision.decided_by == DecidedBy::Fallback)
        {
            DecidedBy::Fallback
        } else {
            DecidedBy::Primary
        }
    }

    /// How long until the request would be admitted: the longest wait of the
    /// denying rules. `None` when allowed, or when some rule can never admit it.
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision().filter(|d| !d.allowed)?.retry_after
    }

    /// [`RateLimitInfo::retry_after`] in whole seconds, rounded up, never 0:
    /// the `Retry-After` value.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.decision().filter(|d| !d.allowed)?.retry_after_secs()
    }
}

impl fmt::Debug for RateLimitInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = self.not_limited() {
            return f.debug_tuple("NotLimited").field(&why).finish();
        }
        f.debug_map()
            .entries(self.iter().map(|(n, _, d)| (n, d)))
            .finish()
    }
}
