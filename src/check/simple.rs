//! The fast lane of a simple layer (see `LayerState::simple`): one rule
//! and nothing to do on an admission but forward. Its key is built, its
//! policy picked (the rule's own, or the request's from a function or a
//! resolver's cache; a resolver still to be asked sends the plan on) and
//! the store asked, with no [`Plan`] until an answer needs one; that answer
//! is judged by `decide::one` like any other.

use std::ops::ControlFlow;
use std::time::Duration;

use super::choose::{pick, tag, Pending};
use super::decide::{admits_bare, one_of_none};
use super::plan::{missing_key, recycle_keys, take_key_buffer};
use super::{count, settled_now, LayerState, Plan, Ruling, Verdict};
use bytes::Bytes;
use http::Response;

use crate::decision::Decision;
use crate::grpc::Reply;
use crate::info::NotLimited;
use crate::key::{bound_key_part, KeyWriter, RequestHead, MAX_KEY_PART};
use crate::response::common_limited;
use crate::store::{Answer, Charge, Store, StoreError};

/// [`now`](super::now) for a simple layer.
#[inline]
pub(super) fn check<St: Store>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
) -> ControlFlow<Verdict<St>, Plan> {
    let rule = &shared.rules[0];
    let mut keys = take_key_buffer();
    keys.extend_from_slice(&rule.key_head);
    let part = keys.len();
    if let Err(missing) = rule.key.extract(req, &mut KeyWriter::new(&mut keys)) {
        recycle_keys(keys);
        let verdict = missing_key(shared, req, 0, &missing)
            .unwrap_or_else(|| Verdict::unchecked(shared, NotLimited::NoKey));
        return ControlFlow::Break(verdict);
    }
    bound_key_part(&mut keys, part, MAX_KEY_PART);
    let cost = rule.cost.of(req);
    // A policy of the request's own, when the rule has a source.
    let picked = match &rule.source {
        None => None,
        Some(source) => match pick(source, req, &keys[part..]) {
            Ok(picked) => picked,
            Err(Pending) => return ControlFlow::Continue(Plan::pending(keys, cost)),
        },
    };
    if let Some(policy) = &picked {
        tag(rule, policy, &mut keys, 0);
    }
    let policy = picked.as_ref().unwrap_or(&rule.policy);
    let mut charge = Charge::new(&keys, policy, cost);
    // An admission's figures are read only by the debug log and the
    // near-limit count; without them, a simple layer (which carries
    // nothing) forwards any admission without a permit.
    let spare = shared.spares_figures
        && !tracing::enabled!(target: "tower_throttle", tracing::Level::DEBUG);
    if spare {
        charge = charge.without_figures();
    }
    let answered = {
        let charges = [charge];
        let answer = shared.store.decide(&charges);
        // Read where the store left it: a bare admission moves nothing.
        let bare = match &answer {
            Answer::Now(Ok(decisions)) if spare => {
                matches!(&decisions[..], [d] if d.allowed && d.permit.is_none())
            }
            Answer::Now(Ok(decisions)) => {
                admits_bare(shared, 0, decisions, Duration::ZERO).unwrap_or(false)
            }
            _ => false,
        };
        match answer {
            _ if bare => None,
            Answer::Now(result) => Some(Some(result)),
            // Unpolled, it charged nothing: the plan goes on through `later`.
            Answer::Later(_) => Some(None),
        }
    };
    let Some(answered) = answered else {
        recycle_keys(keys);
        count(shared, "allowed", None);
        return ControlFlow::Break(Verdict::forward());
    };
    let Some(result) = answered else {
        return ControlFlow::Continue(Plan::one(keys, cost, picked));
    };
    let decisions = match result {
        Ok(decisions) if decisions.len() == 1 => decisions,
        Ok(_) => return settled(shared, Plan::one(keys, cost, picked), req, one_of_none()),
        Err(error) => return settled(shared, Plan::one(keys, cost, picked), req, error),
    };
    // The cached fields are the rule's own policy's.
    let own = picked.as_ref().is_none_or(|p| *p == rule.policy);
    let d = &decisions[0];
    if !d.allowed && shared.plain_denials && own {
        if let Some(response) = plain_denial(shared, req, d) {
            recycle_keys(keys);
            count(shared, "limited", Some(0));
            return ControlFlow::Break(Verdict::Reject(response));
        }
    }
    let ruling = Ruling::Decided(decisions, Duration::ZERO);
    settled_now(shared, Plan::one(keys, cost, picked), req, ruling)
}

/// The common 429 of the rule's denial `d` over HTTP, rendered from the
/// decision alone: what `settled` would answer, without its `RateLimitInfo`
/// (see `response::common_limited`). `None` for any other denial.
#[inline(never)]
fn plain_denial<St: Store>(
    shared: &LayerState<St>,
    req: &RequestHead<'_>,
    d: &Decision,
) -> Option<Box<Response<Bytes>>> {
    if shared.settings.protocol.reply(req.headers()) != Reply::Http {
        return None;
    }
    common_limited(&shared.meta, 0, d)
}

/// A store's failure, settled off the admitted path.
#[inline(never)]
fn settled<St: Store>(
    shared: &LayerState<St>,
    plan: Plan,
    req: &RequestHead<'_>,
    error: StoreError,
) -> ControlFlow<Verdict<St>, Plan> {
    settled_now(shared, plan, req, Ruling::Failed(error))
}
