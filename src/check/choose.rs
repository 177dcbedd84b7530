//! The policy a rule applies to one request: its own, or the request's
//! (chosen while planning, or asked of a resolver by
//! `Plan::resolve_pending`).

use super::planned::PlannedRule;
use super::LayerState;
use crate::key::RequestHead;
use crate::policy::Policy;
use crate::resolve::PolicySource;
use crate::rule::RuleCfg;

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
    let picked = match source {
        PolicySource::Fn(f) => f(req),
        PolicySource::Resolver(r) => {
            match r.resolve_now(&keys[active.start + rule.key_head.len()..active.end]) {
                Some(chosen) => chosen,
                None => {
                    active.pending = true;
                    return;
                }
            }
        }
    };
    if let Some(policy) = picked {
        apply(rule, policy, keys, chosen, active);
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
    let mut tag = Vec::new();
    if !policy.write_state_tag(&rule.policy, &mut tag) {
        return 0;
    }
    // Before the `:` that ends the rule's namespace.
    let at = active.start + rule.key_head.len() - 1;
    keys.splice(at..at, tag.iter().copied());
    active.end += tag.len();
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
