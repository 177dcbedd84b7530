//! Script replies as [`Decision`]s. Never panics: anything unexpected is a
//! [`StoreError::Protocol`].

use std::time::Duration;

use redis::Value;

use super::error::failed;
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
pub(crate) struct SentRule<'a> {
    pub policy: &'a Policy,
    pub cost: u64,
    pub permit: Option<PermitId>,
}

/// The stored state a rule's reply carried, for the algorithms whose
/// decision is rendered from an O(1) state (see [`super::deny`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawState {
    /// GCRA's `tat`, in ns.
    Gcra(u64),
    /// A fixed-window counter.
    Fixed(FixedWindowState),
    /// A sliding-window counter.
    Sliding(SlidingWindowState),
}

impl RawState {
    /// The decision this state gives `policy` at `now_ns` for `cost`, or
    /// `None` if the state is not `policy`'s algorithm.
    pub(crate) fn decide(&self, policy: &Policy, now_ns: u64, cost: u64) -> Option<Decision> {
        match (self, policy.algorithm()) {
            (RawState::Gcra(tat), Algorithm::Gcra(p)) => Some(gcra::check(p, *tat, now_ns, cost)),
            (RawState::Fixed(s), Algorithm::FixedWindow(p)) => {
                Some(fixed_window::check(p, s, now_ns, cost))
            }
            (RawState::Sliding(s), Algorithm::SlidingWindow(p)) => {
                Some(sliding_window::check(p, s, now_ns, cost))
            }
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::Concurrency(_)) => None,
        }
    }
}

/// How many reply fields a rule of `policy` takes.
fn width(policy: &Policy) -> usize {
    match policy.algorithm() {
        Algorithm::Gcra(_) => 2,
        Algorithm::FixedWindow(_) => 3,
        Algorithm::SlidingWindow(_) => 4,
        Algorithm::SlidingLog(_) | Algorithm::Concurrency(_) => 5,
    }
}

/// Renders one rule's reply fields at `now_ns`. For the O(1)-state
/// algorithms the script returns the stored state and the decision is
/// rendered by the same pure function the memory store runs; the script's
/// own verdict must agree.
pub(crate) fn decision(
    rule: &SentRule<'_>,
    items: &[Value],
    now_ns: u64,
) -> Result<(Decision, Option<RawState>), StoreError> {
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
    let mut state = None;
    let d = match *rule.policy.algorithm() {
        Algorithm::Gcra(p) => {
            let tat = gcra_tat(field(1)?)?;
            state = Some(RawState::Gcra(tat));
            gcra::check(&p, tat, now_ns, cost)
        }
        Algorithm::FixedWindow(p) => {
            let s = FixedWindowState {
                window: uint(field(1)?)?,
                count: uint(field(2)?)?,
            };
            state = Some(RawState::Fixed(s));
            fixed_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingWindow(p) => {
            let s = SlidingWindowState {
                window: uint(field(1)?)?,
                current: uint(field(2)?)?,
                previous: uint(field(3)?)?,
            };
            state = Some(RawState::Sliding(s));
            sliding_window::check(&p, &s, now_ns, cost)
        }
        Algorithm::SlidingLog(p) if !p.window_ns.is_multiple_of(1000) => {
            // Code 'L' (sliding_log.lua): whole µs m of 1000·m + W mod 1000
            // ns, or −1 for none.
            let left = |v: &Value| -> Result<Option<Duration>, StoreError> {
                opt_uint(v)?
                    .map(|m| {
                        ns(m)?
                            .checked_add(p.window_ns % 1000)
                            .map(Duration::from_nanos)
                            .ok_or_else(|| bad(format!("time {m} µs out of range")))
                    })
                    .transpose()
            };
            Decision {
                charged: 0,
                charged_at_ns: 0,
                decided_by: Default::default(),
                allowed: script_allowed,
                limit: p.max,
                remaining: uint(field(1)?)?,
                retry_after: left(field(2)?)?,
                reset_after: left(field(3)?)?.unwrap_or_default(),
                quota_after: left(field(4)?)?.unwrap_or_default(),
                permit: None,
            }
        }
        Algorithm::SlidingLog(p) => Decision {
            charged: 0,
            charged_at_ns: 0,
            decided_by: Default::default(),
            allowed: script_allowed,
            limit: p.max,
            remaining: uint(field(1)?)?,
            retry_after: opt_uint(field(2)?)?.map(us_dur).transpose()?,
            reset_after: us_dur(uint(field(3)?)?)?,
            quota_after: us_dur(uint(field(4)?)?)?,
            permit: None,
        },
        Algorithm::Concurrency(p) => Decision {
            charged: 0,
            charged_at_ns: 0,
            decided_by: Default::default(),
            allowed: script_allowed,
            limit: p.max_in_flight,
            remaining: uint(field(1)?)?,
            // In ns (decimal strings: exact at any size).
            retry_after: opt_uint(field(2)?)?.map(Duration::from_nanos),
            reset_after: Duration::from_nanos(uint(field(3)?)?),
            quota_after: Duration::from_nanos(uint(field(4)?)?),
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
    Ok((d, state))
}

/// Offset of a tat stored at nanosecond precision (`gcra_ns.lua`): stored
/// values at or above it are `NS_OFFSET + tat_ns`, below it `tat_µs`.
const NS_OFFSET: u64 = 2_400_000_000_000_000_000;

/// A GCRA tat of a reply, in ns: a µs integer, or the ns encoding as a string.
pub(crate) fn gcra_tat(v: &Value) -> Result<u64, StoreError> {
    match v {
        Value::BulkString(b) => {
            let x: u64 = std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("a GCRA state that is not a number"))?;
            match x.checked_sub(NS_OFFSET) {
                Some(tat) => Ok(tat),
                None => ns(x),
            }
        }
        v => ns(uint(v)?),
    }
}

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

/// One check of a uniform GCRA batch (`gcra_batch.lua`): the stored tat in
/// µs when admitted, −tat − 1 when denied, or the check's own error. The
/// outer error means the reply cannot be trusted at all.
pub(crate) fn uniform_gcra(
    policy: &Policy,
    cost: u64,
    item: &Value,
    now_ns: u64,
) -> Result<Result<Checked, StoreError>, StoreError> {
    let (script_allowed, tat) = match item {
        Value::Int(n) if *n >= 0 => (true, ns(n.unsigned_abs())?),
        // −tat − 1 as an i64: −n − 1 ≥ 0 never overflows.
        Value::Int(n) => (false, ns((-(n + 1)).unsigned_abs())?),
        // The ns encoding: the tat, or '-' and the tat when denied.
        Value::BulkString(b) if b.first().is_some_and(u8::is_ascii_digit) => {
            (true, gcra_tat(item)?)
        }
        Value::BulkString(b) if b.first() == Some(&b'-') => {
            (false, gcra_tat(&Value::BulkString(b[1..].to_vec()))?)
        }
        Value::BulkString(b) => {
            return Ok(Err(failed(String::from_utf8_lossy(b).into_owned())));
        }
        other => return Err(bad(format!("expected a GCRA state, got {other:?}"))),
    };
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
