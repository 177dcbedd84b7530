//! Costs known only after the response: bytes sent, tokens an LLM used.
//!
//! A rule with [`Rule::settle_cost`](crate::Rule::settle_cost) charges an
//! estimate when it admits a request (its [`cost`](crate::Rule::cost) or
//! [`cost_fn`](crate::Rule::cost_fn), 1 by default) and settles the
//! request's actual cost once the response shows it, through the charge's
//! receipt: the difference is given back to the window (or GCRA slot) the
//! estimate was taken from, and a cost above the estimate is charged on top.
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::meter::{ActualCost, ReportedCost};
//! use tower_throttle::{key::BearerToken, MemoryStore, Policy, Rule, ThrottleLayer};
//!
//! // 10,000 tokens a minute per API key; admit with an upper bound of the
//! // request's cost (its `max_tokens`), settle with what the model used.
//! let tokens = Rule::new("tokens", Policy::fixed_window(10_000, Duration::from_secs(60))?)
//!     .key(BearerToken)
//!     .cost_fn(|req| {
//!         let max = req.headers().get("x-max-tokens").and_then(|v| v.to_str().ok());
//!         max.and_then(|v| v.parse().ok()).unwrap_or(4_096)
//!     })
//!     .settle_cost(ActualCost::Reported);
//! let layer = ThrottleLayer::new(MemoryStore::new(), Policy::token_bucket(10, 10.0)?)
//!     .key(BearerToken)
//!     .and(tokens);
//!
//! // In the handler: the response reports what the request cost.
//! let mut response = http::Response::new(());
//! response.extensions_mut().insert(ReportedCost(212));
//! # let _ = layer;
//! # Ok::<(), tower_throttle::PolicyError>(())
//! ```
//!
//! # How exact
//!
//! - **An estimate that is an upper bound** (the request's `max_tokens`, a
//!   download's `Content-Length`) is exact, sequential or concurrent: a
//!   request is admitted only if its estimate fits, and settling only gives
//!   units back.
//! - **Every estimate is at least 1.** An estimate of 0 (a client that
//!   sends `max_tokens=0`, a header left out) is charged as 1 and given back
//!   at settlement if the request cost nothing: a check of 0 units would only
//!   peek and be admitted on a spent quota. So a request on a spent quota is
//!   refused, whatever its estimate, and the requests admitted in a window
//!   are never more than the limit admits of 1-unit requests.
//! - **An estimate below the actual cost**: the excess is charged when the
//!   response ends, as far as the quota has room; what does not fit is that
//!   response's *overshoot*, not carried over. The quota is then spent, so
//!   the next request is refused until it refills:
//!   - on a fixed window, sequential requests cost at most the limit plus
//!     one response's overshoot per window;
//!   - on a sliding window, a sliding log and GCRA the quota refills a unit
//!     at a time, and each unit that comes back can admit one more request
//!     with an overshoot of its own: at most one overshoot per unit refilled
//!     after the quota was spent. An upper-bound estimate avoids this.
//!   - concurrent requests exceed the limit by at most the sum of their
//!     in-flight estimates' errors.
//!
//!   The overshoot is dropped rather than carried as debt because not every
//!   store can hold state beyond its limit (redis-cell's `CL.THROTTLE` has no
//!   such charge), and one definition must hold on every store.
//! - A cost that is never reported (no [`ReportedCost`], no trailer), and a
//!   settlement the store fails, leave the estimate charged.
//! - With [`count_if`](crate::ThrottleLayer::count_if), a response that does
//!   not count gives back the whole charge; one that counts is settled.

use http::HeaderName;

/// Where a rule's actual cost comes from (see the [module docs](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ActualCost {
    /// The bytes of the response body, counted as its data frames go out:
    /// settled when the body ends, or with the bytes sent so far when it
    /// fails or is dropped (a client that hangs up pays for what it got).
    ResponseBytes,
    /// The [`ReportedCost`] the inner service put in the response's
    /// extensions, read when the response head arrives.
    Reported,
    /// A number in the response's trailers under this name (e.g.
    /// `x-usage-tokens`), for a streamed response that knows its usage only
    /// at its end; a [`ReportedCost`] in the head's extensions is used when
    /// the trailers lack it.
    Trailer(HeaderName),
}

/// A response extension: what the request actually cost, in the units of
/// the rules that settle with [`ActualCost::Reported`] (or
/// [`ActualCost::Trailer`], as a fallback).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReportedCost(pub u64);
