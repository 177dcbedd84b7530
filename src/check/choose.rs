//! The policy a rule applies to one request: its own, or the request's
//! (chosen while planning, or asked of a resolver by
//! `Plan::resolve_pending`).

use super::planned::PlannedRule;
use super::LayerState;
use crate::key::RequestHead;
use crate::policy::Policy;
use crate::resolve::PolicySource;
use crate::rule::RuleCfg;

/// The request's policy for `rule` from `source` (`key_part`: the rule's
/// key part): `Some` a policy, `None` the rule's own; `Err(Pending)` when
/// only an asynchronous resolver knows.
#[inline]
pub(super) fn pick(
    source: &PolicySource,
    req: &RequestHead<'_>,
    key_part: &[u8],
) -> Result<Option<Policy>, Pending> {
    match source {
        PolicySource::Fn(f) => Ok(f(req)),
        PolicySource::Resolver(r) => r.resolve_now(key_part).ok_or(Pending),
    }
}

/// The request's policy is known only to a resolver's future.
pub(super) struct Pending;

/// Sets the request's policy on `active` (the plan's last rule, its key at
/// the end of `keys`), or marks it pending when only an asynchronous
/// resolver knows it.
pub(super) fn choose(
    rule: &RuleCfg,
    source: &PolicySource,
    req: &RequestHead<'_>,
    keys: &mut Vec<u8>,
    chosen: &mut Vec<Policy>,
    active: &mut PlannedRule,
) {
    let key_part = &keys[active.start + rule.key_head.len()..active.end];
    match pick(source, req, key_part) {
        Ok(Some(policy)) => {
            apply(rule, policy, keys, chosen, active);
        }
        Ok(None) => {}
        Err(Pending) => active.pending = true,
    }
}

/// Applies `policy` to `active`, tagging its key when the policy cannot
/// share the rule's state (see [`crate::resolve`]). Returns how many bytes
/// the key grew by (the caller moves the keys after it).
pub(super) fn apply(
    rule: &RuleCfg,
    policy: Policy,
    keys: &mut Vec<u8>,
    chosen: &mut Vec<Policy>,
    active: &mut PlannedRule,
) -> usize {
    active.chosen = Some(u32::try_from(chosen.len()).unwrap_or(u32::MAX));
    chosen.push(policy);
    let grown = tag(rule, &policy, keys, active.start);
    active.end += grown;
    grown
}

/// Tags the key of `rule` that starts at `start` in `keys` for `policy`
/// when that policy cannot share the rule's state (see
/// [`crate::resolve`]); returns how many bytes the key grew by.
pub(super) fn tag(rule: &RuleCfg, policy: &Policy, keys: &mut Vec<u8>, start: usize) -> usize {
    let mut tag = Vec::new();
    if !policy.write_state_tag(&rule.policy, &mut tag) {
        return 0;
    }
    // Before the `:` that ends the rule's namespace.
    let at = start + rule.key_head.len() - 1;
    keys.splice(at..at, tag.iter().copied());
    tag.len()
}

/// The policy `rule`'s resolver gives the request of key part `key`,
/// within the layer's store timeout, if any; `None` (with a warning when it
/// failed or timed out) leaves the rule's own.
pub(super) async fn resolve<St>(
    shared: &LayerState<St>,
    rule: &RuleCfg,
    key: &[u8],
) -> Option<Policy> {
    let Some(PolicySource::Resolver(resolver)) = &rule.source else {
        return None;
    };
    let call = resolver.resolve(key);
    let answer = match shared.settings.timeout {
        Some(limit) => tokio::time::timeout(limit, call)
            .await
            .unwrap_or_else(|_| Err(format!("timed out after {limit:?}").into())),
        None => call.await,
    };
    answer.unwrap_or_else(|error| {
        tracing::warn!(target: "tower_throttle", %error, "policy resolver failed: the rule's own policy applies");
        None
    })
}
