//! Script replies as [`Decision`]s. Never panics: anything unexpected is a
//! [`StoreError::Protocol`].

use std::time::Duration;

use redis::Value;

use crate::algorithm::fixed_window::{self, FixedWindowState};
use crate::algorithm::gcra;
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::decision::{Decision, PermitId};
use crate::policy::{Algorithm, Policy};
use crate::store::StoreError;

fn bad(what: impl Into<String>) -> StoreError {
    StoreError::Protocol(what.into())
}

/// A non-negative integer of a reply.
pub(crate) fn uint(v: &Value) -> Result<u64, StoreError> {
    let n = match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a non-numeric string where a number was expected"))?,
        other => return Err(bad(format!("expected an integer, got {other:?}"))),
    };
    u64::try_from(n).map_err(|_| bad(format!("negative value {n}")))
}

/// An integer that may be −1 ("none").
fn opt_uint(v: &Value) -> Result<Option<u64>, StoreError> {
    match v {
        Value::Int(-1) => Ok(None),
        v => uint(v).map(Some),
    }
}

/// µs → ns, refusing values past u64 nanoseconds.
pub(crate) fn ns(us: u64) -> Result<u64, StoreError> {
    us.checked_mul(1000)
        .ok_or_else(|| bad(format!("time {us} µs out of range")))
}

fn us_dur(us: u64) -> Result<Duration, StoreError> {
    ns(us).map(Duration::from_nanos)
}

/// The items of an array reply.
pub(crate) fn array(v: &Value) -> Result<&[Value], StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(bad(format!("expected an array, got {other:?}"))),
    }
}

/// One rule as the check script saw it.
#[derive(Clone, Copy)]
pub(crate) struct RuleReply<'a> {
    pub policy: &'a Policy,
    pub cost: u64,
    pub permit: Option<PermitId>,
}

/// Renders one rule's reply at `now_ns`. For the O(1)-state algorithms the
/// script returns the stored state and the decision is rendered by the same
/// pure function the memory store runs; the script's own verdict must agree.
pub(crate) fn decision(
    rule: &RuleReply<'_>,
    v: &Value,
    now_ns: u64,
) -> Result<Decision, StoreError> {
    let items = array(v)?;
    let field = |i: usize| {
        items
            .get(i)
            .ok_or_else(|| bad(format!("rule reply too short ({} items)", items.len())))
    };
    let script_allowed = match uint(field(0)?)? {
        0 => false,
        1 => true,
        n => return Err(bad(format!("verdict {n}"))),
    };
    let cost = rule.cost;
    let d = match *rule.policy.algorithm() {
        Algorithm::Gcra(p) => gcra::check(&p, ns(uint(field(1)?)?)?, now_ns, cost),
        Algorithm::FixedWindow(p) => {
            let s = FixedWindowState {
                window: uint(field(1)?)?,
                count: uint(field(2)?)?,
            };
            fixed_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingWindow(p) => {
            let s = SlidingWindowState {
                window: uint(field(1)?)?,
                current: uint(field(2)?)?,
                previous: uint(field(3)?)?,
            };
            sliding_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingLog(p) => Decision {
            allowed: script_allowed,
            limit: p.max,
            remaining: uint(field(1)?)?,
            retry_after: opt_uint(field(2)?)?.map(us_dur).transpose()?,
            reset_after: us_dur(uint(field(3)?)?)?,
            permit: None,
        },
        Algorithm::Concurrency(p) => Decision {
            allowed: script_allowed,
            limit: p.max_in_flight,
            remaining: uint(field(1)?)?,
            retry_after: opt_uint(field(2)?)?.map(us_dur).transpose()?,
            reset_after: us_dur(uint(field(3)?)?)?,
            permit: if script_allowed && cost > 0 {
                rule.permit
            } else {
                None
            },
        },
    };
    if d.allowed != script_allowed {
        return Err(bad(format!(
            "the script decided {script_allowed} where the model decides {}",
            d.allowed
        )));
    }
    Ok(d)
}

/// Parses the check script's reply `{now, rule 1, rule 2, …}`; returns the
/// decisions and `now` in nanoseconds.
pub(crate) fn decisions(rules: &[RuleReply<'_>], v: &Value) -> Result<Vec<Decision>, StoreError> {
    let items = array(v)?;
    if items.len() != rules.len() + 1 {
        return Err(bad(format!(
            "{} items for {} rules",
            items.len(),
            rules.len()
        )));
    }
    let now_ns = ns(uint(&items[0])?)?;
    // When a rule denies nothing is charged, and the rules that would have
    // passed report a peek (the script sent their state, or their check at
    // cost 0).
    let verdicts = items[1..]
        .iter()
        .map(|v| array(v).and_then(|f| f.first().map_or(Ok(0), uint)))
        .collect::<Result<Vec<u64>, _>>()?;
    let all = verdicts.iter().all(|&v| v == 1);
    rules
        .iter()
        .zip(&items[1..])
        .zip(verdicts)
        .map(|((r, v), verdict)| {
            let peek = RuleReply {
                cost: 0,
                permit: None,
                ..*r
            };
            decision(if all || verdict != 1 { r } else { &peek }, v, now_ns)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_replies_are_protocol_errors_not_panics() {
        let p = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let r = [RuleReply {
            policy: &p,
            cost: 1,
            permit: None,
        }];
        let odd = [
            Value::Nil,
            Value::Int(5),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(-5), Value::Array(vec![])]),
            Value::Array(vec![Value::Int(1), Value::Array(vec![Value::Int(1)])]),
            Value::Array(vec![
                Value::Int(i64::MAX),
                Value::Array(vec![Value::Int(1), Value::Int(0)]),
            ]),
            Value::Array(vec![
                Value::Int(1),
                Value::Array(vec![Value::Int(7), Value::Int(0)]),
            ]),
            Value::Array(vec![
                Value::Int(1),
                Value::Array(vec![Value::BulkString(b"x".to_vec()), Value::Int(0)]),
            ]),
            // the model admits a fresh key: a "denied" verdict disagrees
            Value::Array(vec![
                Value::Int(1),
                Value::Array(vec![Value::Int(0), Value::Int(0)]),
            ]),
        ];
        for v in odd {
            assert!(
                matches!(decisions(&r, &v), Err(StoreError::Protocol(_))),
                "{v:?}"
            );
        }
        let ok = Value::Array(vec![
            Value::Int(1_000_000),
            Value::Array(vec![Value::Int(1), Value::Int(0)]),
        ]);
        assert!(decisions(&r, &ok).unwrap()[0].allowed);
    }
}
