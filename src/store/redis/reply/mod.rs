//! Script replies as [`Decision`]s. Never panics: anything unexpected is a
//! [`StoreError::Protocol`].

use redis::Value;

use crate::algorithm::gcra;
use crate::decision::Decision;
use crate::policy::{Algorithm, Policy};
use crate::store::redis::error::failed;
use crate::store::StoreError;

// The fields of a reply (`value`) and one rule's decision (`rule`); this
// file reads whole checks of the flat reply.
mod rule;
mod value;

use rule::{decision, width};
pub(crate) use rule::{RawState, SentRule};
pub(crate) use value::array;
use value::{bad, gcra_tat, ns, uint};

/// One check's decisions, and the state of its first rule.
pub(crate) type Checked = (Vec<Decision>, Option<RawState>);

/// The `now` (in ns) that heads the check script's flat reply, and the items
/// after it.
pub(crate) fn head(v: &Value) -> Result<(u64, &[Value]), StoreError> {
    let items = array(v)?;
    let now = items.first().ok_or_else(|| bad("empty reply"))?;
    Ok((ns(uint(now)?)?, &items[1..]))
}

/// Parses one check of the flat reply from `items[*pos..]` and moves `pos`
/// past it. The outer error means the reply cannot be read any further; the
/// inner one is this check's own failure.
pub(crate) fn check(
    rules: &[SentRule<'_>],
    items: &[Value],
    pos: &mut usize,
    now_ns: u64,
) -> Result<Result<Checked, StoreError>, StoreError> {
    let status = uint(items.get(*pos).ok_or_else(|| bad("reply too short"))?)?;
    *pos += 1;
    match status {
        1 => {}
        2 => {
            let msg = match items.get(*pos) {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                other => return Err(bad(format!("error message expected, got {other:?}"))),
            };
            *pos += 1;
            return Ok(Err(failed(msg)));
        }
        n => return Err(bad(format!("check status {n}"))),
    }
    if let [r] = rules {
        // One rule (most checks): its own verdict decides, no peek, and
        // nothing is collected on the way.
        let w = width(r.policy);
        let f = items
            .get(*pos..*pos + w)
            .ok_or_else(|| bad("reply too short for 1 rules"))?;
        *pos += w;
        let charged = uint(&f[0])? == 1;
        let (mut d, s) = decision(r, f, now_ns)?;
        if charged {
            d.stamp(now_ns, r.cost);
        }
        return Ok(Ok((vec![d], s)));
    }
    let mut fields = Vec::with_capacity(rules.len());
    for r in rules {
        let w = width(r.policy);
        let f = items
            .get(*pos..*pos + w)
            .ok_or_else(|| bad(format!("reply too short for {} rules", rules.len())))?;
        fields.push(f);
        *pos += w;
    }
    // When a rule denies nothing is charged, and the rules that would have
    // passed report a peek (the script sent their state, or their check at
    // cost 0).
    let verdicts = fields
        .iter()
        .map(|f| uint(&f[0]))
        .collect::<Result<Vec<u64>, _>>()?;
    let all = verdicts.iter().all(|&v| v == 1);
    let mut out = Vec::with_capacity(rules.len());
    let mut first = None;
    for (i, ((r, f), verdict)) in rules.iter().zip(fields).zip(verdicts).enumerate() {
        let peek = SentRule {
            cost: 0,
            permit: None,
            ..*r
        };
        let (mut d, s) = decision(if all || verdict != 1 { r } else { &peek }, f, now_ns)?;
        if i == 0 {
            first = s;
        }
        // Only a check that charged every rule took anything.
        if all {
            d.stamp(now_ns, r.cost);
        }
        out.push(d);
    }
    Ok(Ok((out, first)))
}

/// One check of a uniform GCRA batch (`gcra_batch.lua`): the tat's offset
/// from now in ns when admitted, −offset − 1 when denied, or the check's own
/// error. The outer error means the reply cannot be trusted at all.
pub(crate) fn uniform_gcra(
    policy: &Policy,
    cost: u64,
    item: &Value,
    now_ns: u64,
) -> Result<Result<Checked, StoreError>, StoreError> {
    let (script_allowed, offset) = match item {
        Value::Int(n) if *n >= 0 => (true, n.unsigned_abs()),
        // −offset − 1 as an i64: −n − 1 ≥ 0 never overflows.
        Value::Int(n) => (false, (-(n + 1)).unsigned_abs()),
        Value::BulkString(b) => {
            return Ok(Err(failed(String::from_utf8_lossy(b).into_owned())));
        }
        other => return Err(bad(format!("expected a GCRA state, got {other:?}"))),
    };
    let tat = gcra_tat(offset, now_ns)?;
    let Algorithm::Gcra(p) = policy.algorithm() else {
        return Err(bad("a GCRA reply for another algorithm"));
    };
    let d = gcra::check(p, tat, now_ns, cost);
    if d.allowed != script_allowed {
        return Err(bad(format!(
            "the script decided {script_allowed} where the model decides {}",
            d.allowed
        )));
    }
    let mut d = d;
    d.stamp(now_ns, cost);
    Ok(Ok((vec![d], Some(RawState::Gcra(tat)))))
}

/// One check of a uniform fixed-window batch (`fixed_batch.lua`, windows
/// of `window_us`): `2·count + allowed` for the state in the window of
/// `now`, `[allowed, window, count]` for a later window, or the check's own
/// error. Rendered as the check script's fields would be.
pub(crate) fn uniform_fixed(
    rule: &SentRule<'_>,
    window_us: u64,
    item: &Value,
    now_ns: u64,
) -> Result<Result<Checked, StoreError>, StoreError> {
    let fields = match item {
        Value::Int(n) if *n >= 0 && window_us > 0 => {
            let n = n.unsigned_abs();
            let window = now_ns / 1000 / window_us;
            [
                Value::Int(i64::from(n % 2 == 1)),
                uint_value(window)?,
                uint_value(n / 2)?,
            ]
        }
        Value::Array(fields) if fields.len() == 3 => {
            [fields[0].clone(), fields[1].clone(), fields[2].clone()]
        }
        Value::BulkString(b) => return Ok(Err(failed(String::from_utf8_lossy(b).into_owned()))),
        other => return Err(bad(format!("expected a fixed-window state, got {other:?}"))),
    };
    let charged = uint(&fields[0])? == 1;
    let (mut d, s) = decision(rule, &fields, now_ns)?;
    if charged {
        d.stamp(now_ns, rule.cost);
    }
    Ok(Ok((vec![d], s)))
}

fn uint_value(n: u64) -> Result<Value, StoreError> {
    i64::try_from(n)
        .map(Value::Int)
        .map_err(|_| bad(format!("{n} out of range")))
}

/// Parses the reply of a batch of one check.
#[cfg(test)]
pub(crate) fn decisions(rules: &[SentRule<'_>], v: &Value) -> Result<Vec<Decision>, StoreError> {
    let (now, items) = head(v)?;
    let mut pos = 0;
    let d = check(rules, items, &mut pos, now)??;
    if pos != items.len() {
        return Err(bad("trailing items"));
    }
    Ok(d.0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ints(n: &[i64]) -> Value {
        Value::Array(n.iter().map(|&i| Value::Int(i)).collect())
    }

    #[test]
    fn odd_replies_are_protocol_errors_not_panics() {
        let p = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
        let r = [SentRule {
            policy: &p,
            cost: 1,
            permit: None,
        }];
        let odd = [
            Value::Nil,
            Value::Int(5),
            Value::Array(vec![]),
            ints(&[1]),
            ints(&[-5, 1, 1, 0]),
            ints(&[1, 1, 1]),
            ints(&[1, 3, 1, 0]),
            ints(&[i64::MAX, 1, 1, 0]),
            ints(&[1, 1, 7, 0]),
            ints(&[1, 1, 1, 0, 9]),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(1),
                Value::BulkString(b"x".to_vec()),
                Value::Int(0),
            ]),
            Value::Array(vec![Value::Int(1), Value::Int(2), Value::Int(0)]),
            // the model admits a fresh key: a "denied" verdict disagrees
            ints(&[1_000_000, 1, 0, 0]),
        ];
        for v in odd {
            assert!(
                matches!(decisions(&r, &v), Err(StoreError::Protocol(_))),
                "{v:?}"
            );
        }
        assert!(decisions(&r, &ints(&[1_000_000, 1, 1, 0])).unwrap()[0].allowed);
        let failed = Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::BulkString(b"WRONGTYPE".to_vec()),
        ]);
        assert!(matches!(decisions(&r, &failed), Err(StoreError::Script(_))));
    }
}
