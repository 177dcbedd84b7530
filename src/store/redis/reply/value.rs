//! The fields of a script reply: integers, times and arrays read without
//! panicking, anything unexpected a [`StoreError::Protocol`].

use std::time::Duration;

use redis::Value;

use crate::store::StoreError;

/// A reply this crate does not understand.
pub(super) fn bad(what: impl Into<String>) -> StoreError {
    StoreError::Protocol(what.into())
}

/// A non-negative integer of a reply.
pub(super) fn uint(v: &Value) -> Result<u64, StoreError> {
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
pub(super) fn opt_uint(v: &Value) -> Result<Option<u64>, StoreError> {
    match v {
        Value::Int(-1) => Ok(None),
        v => uint(v).map(Some),
    }
}

/// µs → ns, refusing values past u64 nanoseconds.
pub(super) fn ns(us: u64) -> Result<u64, StoreError> {
    us.checked_mul(1000)
        .ok_or_else(|| bad(format!("time {us} µs out of range")))
}

/// µs as a [`Duration`], refusing values past u64 nanoseconds.
pub(super) fn us_dur(us: u64) -> Result<Duration, StoreError> {
    ns(us).map(Duration::from_nanos)
}

/// The items of an array reply.
pub(crate) fn array(v: &Value) -> Result<&[Value], StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(bad(format!("expected an array, got {other:?}"))),
    }
}

/// A GCRA tat of a reply, in ns: `now_ns` plus the offset the script
/// replies (`gcra.lua`: 0 when the tat is past).
pub(super) fn gcra_tat(offset: u64, now_ns: u64) -> Result<u64, StoreError> {
    now_ns
        .checked_add(offset)
        .ok_or_else(|| bad(format!("tat offset {offset} ns out of range")))
}
