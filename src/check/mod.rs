//! One request's check, in three stages: [`plan`] builds every rule's key
//! and policy, [`evaluate`] asks the store (at once in process, else
//! through a future in `later`), [`settle`] applies the layer's mode to the
//! answer.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use crate::info::Meta;
use crate::rule::RuleCfg;
use crate::settings::Settings;
use crate::store::Store;

mod charge;
mod choose;
mod evaluate;
mod hold;
mod later;
mod lockout;
mod permits;
mod plan;
mod planned;
mod settle;

pub(crate) use charge::HeldCharge;
pub(crate) use evaluate::decide_now;
pub(crate) use hold::Holds;
pub(crate) use later::evaluate;
pub(crate) use permits::HeldPermits;
pub(crate) use plan::Plan;
pub(crate) use settle::Verdict;

/// Everything a layer's services share.
pub(crate) struct LayerState<St> {
    pub(crate) store: Arc<St>,
    /// Hold times and releases of this layer's concurrency permits.
    pub(crate) holds: Arc<Holds>,
    pub(crate) rules: Box<[RuleCfg]>,
    pub(crate) meta: Arc<Meta>,
    pub(crate) settings: Settings,
    /// One rule with its own policy, no skip, lock-out or delay, and nothing
    /// an admission carries forward: [`decide_now`] takes its short path
    /// (see [`Settings::simple`]).
    pub(crate) simple: bool,
    /// Keeps the layer's key namespaces claimed in the store while any of
    /// its services lives.
    pub(crate) _owner: Arc<()>,
    /// The `prefix` label of the metrics ("" without a prefix).
    #[cfg(feature = "metrics")]
    pub(crate) metric_prefix: Arc<str>,
    /// The `rule` label of outcomes about every rule: the names, `+`-joined.
    #[cfg(feature = "metrics")]
    pub(crate) metric_rules: Arc<str>,
}

/// Where a request's check stands: what [`plan`] found, then what
/// [`decide_now`] decided.
pub(crate) enum Stage<St: Store> {
    /// Admitted in process, with nothing to carry forward: the hot path.
    Admitted,
    /// Not limited: `skip_if`, or every rule skipped for want of a key.
    Skipped,
    /// Answered before any check (a missing key, a misconfiguration).
    Answered(Box<Response<Bytes>>),
    /// Decided in process, with something to carry forward or a rejection.
    Decided(Verdict<St>),
    /// The plan still to check: after [`plan`], in process or not; after
    /// [`decide_now`], through [`evaluate`] (an asynchronous store, a
    /// resolver, delay mode).
    Check(Plan),
}

/// Counts a request's outcome (feature `metrics`), labelled with the
/// layer's prefix (empty when none) and the rule that decided it: the one
/// that denied or found no key, or every rule's name joined with `+` when
/// the request as a whole was admitted or the store failed. Labels come
/// from configuration only, never from requests: the series are bounded by
/// outcomes × layers × rules.
#[inline]
pub(super) fn count<St>(shared: &LayerState<St>, outcome: &'static str, rule: Option<usize>) {
    #[cfg(feature = "metrics")]
    {
        let rule = rule.map_or_else(
            || shared.metric_rules.clone(),
            |i| shared.meta.rules[i].name.clone(),
        );
        metrics::counter!(
            "tower_throttle_requests_total",
            "outcome" => outcome,
            "prefix" => shared.metric_prefix.clone(),
            "rule" => rule
        )
        .increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (shared, outcome, rule);
}
