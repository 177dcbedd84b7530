//! What a Redis store refuses before any traffic ([`Store::validate`]):
//! policies the scripts cannot evaluate exactly, and multi-rule checks whose
//! keys cannot share a cluster slot.

use super::keys::HashTag;
use super::params::Params;
use crate::policy::{Algorithm, GcraParams};
use crate::store::{RuleSpec, StoreError};

/// The request part the rules' keys are tried with: the layer gives every
/// rule of a check the same part when they share a key extractor.
const SAMPLE: &[u8] = b"sample-key";

/// Checks every policy as the scripts would, and on a cluster that the keys
/// of one check land in one slot.
pub(crate) fn rules(
    rules: &[RuleSpec<'_>],
    tag: &HashTag,
    cluster: bool,
) -> Result<(), StoreError> {
    for rule in rules {
        Params::of(rule.policy)?;
    }
    if cluster && !one_slot(rules, tag) {
        return Err(StoreError::Config(format!(
            "the {n} rules of one check must share a Redis Cluster hash slot (a script touches \
             one slot), but under HashTag::{tag:?} their keys land in different slots: {fix}",
            n = rules.len(),
            fix = if *tag != HashTag::AfterFirst(b':')
                && one_slot(rules, &HashTag::AfterFirst(b':'))
            {
                "use HashTag::AfterFirst(b':') (the layer's keys are `rule-name:key`), or \
                 HashTag::Fixed"
            } else {
                "use HashTag::Fixed (one slot for every key), give each rule its own layer, or \
                 build keys whose part after a delimiter is the shared identity and use \
                 HashTag::AfterFirst"
            },
        )));
    }
    Ok(())
}

/// What [`CellStore`](super::CellStore) can run: one GCRA rule per check.
pub(crate) fn cell(rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
    if rules.len() > 1 {
        return Err(StoreError::Unsupported(
            "multi-rule checks on CellStore (CL.THROTTLE is one key at a time); use RedisStore",
        ));
    }
    match rules.first().map(|r| r.policy.algorithm()) {
        None => Ok(()),
        // Only `Policy::cell` in whole seconds has a `CL.THROTTLE` form.
        Some(Algorithm::Gcra(p)) => cell_args(p).map(|_| ()),
        Some(_) => Err(StoreError::Unsupported(
            "policies other than GCRA on CellStore (redis-cell); use Policy::cell, or \
             RedisStore for funnels, token buckets, windows, logs and concurrency",
        )),
    }
}

/// Whether the rules' keys share a tag when their request part is the same.
fn one_slot(rules: &[RuleSpec<'_>], tag: &HashTag) -> bool {
    let tag_of = |r: &RuleSpec<'_>| tag.tag(&[r.key_head, SAMPLE].concat());
    let mut tags = rules.iter().map(tag_of);
    let first = tags.next();
    tags.all(|t| Some(t) == first)
}

/// The arguments the user gave [`Policy::cell`]: `(max_burst, count,
/// period_s)`, sent as they are. Other GCRA policies (funnel, token bucket,
/// a reservation's stretched tolerance) and periods that are not whole
/// seconds have no `CL.THROTTLE` form with the same decisions.
pub(super) fn cell_args(p: &GcraParams) -> Result<(u64, u64, u64), StoreError> {
    let Some(a) = p.cell else {
        return Err(StoreError::Unsupported(
            "GCRA policies not built with Policy::cell on CellStore (redis-cell takes \
             max_burst, count and period as given; use RedisStore)",
        ));
    };
    let fits = |n: u64| i64::try_from(n).is_ok();
    if a.period.subsec_nanos() != 0
        || !fits(a.period.as_secs())
        || !fits(a.max_burst)
        || !fits(a.count)
        || p.tolerance_ns != p.emission_interval_ns.saturating_mul(p.limit)
    {
        return Err(StoreError::Unsupported(
            "Policy::cell arguments redis-cell cannot take (periods in whole seconds, \
             values up to i64::MAX)",
        ));
    }
    Ok((a.max_burst, a.count, a.period.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::time::Duration;

    #[test]
    fn cluster_rules_must_share_a_slot() {
        let p = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let two = [RuleSpec::new(&p, b"minute:"), RuleSpec::new(&p, b"day:")];
        let prefixed = [
            RuleSpec::new(&p, b"reply:minute:"),
            RuleSpec::new(&p, b"reply:day:"),
        ];
        assert!(rules(&two, &HashTag::PerKey, false).is_ok());
        let err = rules(&two, &HashTag::PerKey, true).unwrap_err();
        assert!(err.to_string().contains("AfterFirst(b':')"), "{err}");
        assert!(rules(&two, &HashTag::AfterFirst(b':'), true).is_ok());
        let err = rules(&prefixed, &HashTag::AfterFirst(b':'), true).unwrap_err();
        assert!(err.to_string().contains("HashTag::Fixed"), "{err}");
        assert!(rules(&prefixed, &HashTag::Fixed("app".into()), true).is_ok());
        assert!(rules(&two[..1], &HashTag::PerKey, true).is_ok());
    }

    #[test]
    fn cell_store_runs_one_gcra_rule() {
        let gcra = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let window = Policy::fixed_window(1, Duration::from_secs(1)).unwrap();
        assert!(cell(&[RuleSpec::new(&gcra, b"")]).is_ok());
        let err = cell(&[RuleSpec::new(&window, b"")]).unwrap_err();
        assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
        assert!(err.to_string().contains("Policy::cell"), "{err}");
        let both = [RuleSpec::new(&gcra, b"a:"), RuleSpec::new(&gcra, b"b:")];
        assert!(matches!(cell(&both), Err(StoreError::Unsupported(_))));
    }

    /// Only `Policy::cell` in whole seconds has a `CL.THROTTLE` form: the
    /// other GCRA policies are refused at build, as `check` would refuse
    /// each request.
    #[test]
    fn cell_store_refuses_gcra_policies_redis_cell_cannot_take() {
        let refused = [
            Policy::funnel(3, 2.5).unwrap(),
            Policy::token_bucket(10, 3.0).unwrap(),
            Policy::cell(1, 2, Duration::from_millis(1_500)).unwrap(),
        ];
        for policy in &refused {
            let err = cell(&[RuleSpec::new(policy, b"")]).unwrap_err();
            assert!(
                matches!(err, StoreError::Unsupported(_)),
                "{policy:?}: {err:?}"
            );
        }
        let minute = Policy::cell(4, 5, Duration::from_secs(60)).unwrap();
        assert!(cell(&[RuleSpec::new(&minute, b"")]).is_ok());
    }
}
