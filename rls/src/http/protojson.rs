//! `RateLimitRequest` from and `RateLimitResponse` to protobuf JSON, as Go's
//! `protojson` reads and writes them: camelCase or proto names on input,
//! unknown fields refused; camelCase on output, zero values left out, enums
//! by name, durations as `"12s"`.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

use crate::config::Unit;

type Fields = Map<String, Value>;

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Fields, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} must be an object"))
}

/// Each field of `o` through `f` by its proto name (camelCase accepted).
fn fields(
    o: &Fields,
    known: &[(&str, &str)],
    mut f: impl FnMut(&str, &Value) -> Result<(), String>,
) -> Result<(), String> {
    for (name, value) in o {
        let proto = known
            .iter()
            .find(|(snake, camel)| name == snake || name == camel)
            .map(|(snake, _)| *snake)
            .ok_or_else(|| format!("unknown field {name:?}"))?;
        if !value.is_null() {
            f(proto, value)?;
        }
    }
    Ok(())
}

fn string(v: &Value, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what} must be a string"))
}

/// An unsigned integer as the proto3 JSON mapping reads one: a number or
/// a string, exponent notation accepted (`1e3`, `"2.5e1"`) when the value
/// is whole; `null` is the default (0).
fn whole(v: &Value, what: &str, max: u64) -> Result<u64, String> {
    let n = match v {
        Value::Null => Some(0),
        Value::Number(n) => integral(&n.to_string()),
        Value::String(s) => integral(s),
        _ => None,
    };
    n.filter(|n| *n <= u128::from(max))
        .map(|n| n as u64)
        .ok_or_else(|| format!("{what} must be a whole number up to {max}"))
}

/// The whole number a JSON number's text (no sign) spells exactly: digits,
/// a fraction and an exponent, so long as no fractional part remains.
fn integral(text: &str) -> Option<u128> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(i) => (&text[..i], text[i + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = || int.bytes().chain(frac.bytes());
    if int.is_empty() || !digits().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let shift = exponent.checked_sub(i32::try_from(frac.len()).ok()?)?;
    let all: Vec<u8> = digits().collect();
    let kept = match usize::try_from(shift.unsigned_abs()).ok()? {
        // A fraction left: only zeros may be dropped.
        cut if shift < 0 => {
            let (kept, dropped) = all.split_at(all.len().checked_sub(cut)?);
            dropped.iter().all(|&b| b == b'0').then_some(kept)?
        }
        _ => &all[..],
    };
    let mut n: u128 = 0;
    for &b in kept {
        n = n.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    if n == 0 {
        return Some(0);
    }
    // Overflows within 39 steps for anything but 0.
    for _ in 0..shift.max(0) {
        n = n.checked_mul(10)?;
    }
    Some(n)
}

/// Parses a request body.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let mut req = RateLimitRequest::default();
    fields(
        object(&v, "the request")?,
        &[
            ("domain", "domain"),
            ("descriptors", "descriptors"),
            ("hits_addend", "hitsAddend"),
        ],
        |name, v| {
            match name {
                "domain" => req.domain = string(v, "domain")?,
                "hits_addend" => {
                    req.hits_addend = whole(v, "hitsAddend", u64::from(u32::MAX))? as u32
                }
                _ => {
                    let list = v.as_array().ok_or("descriptors must be a list")?;
                    req.descriptors = list.iter().map(descriptor).collect::<Result<_, _>>()?;
                }
            }
            Ok(())
        },
    )?;
    Ok(req)
}

fn descriptor(v: &Value) -> Result<RateLimitDescriptor, String> {
    let mut d = RateLimitDescriptor::default();
    fields(
        object(v, "a descriptor")?,
        &[
            ("entries", "entries"),
            ("limit", "limit"),
            ("hits_addend", "hitsAddend"),
            ("is_negative_hits", "isNegativeHits"),
        ],
        |name, v| {
            match name {
                "entries" => {
                    let list = v.as_array().ok_or("entries must be a list")?;
                    d.entries = list.iter().map(entry).collect::<Result<_, _>>()?;
                }
                "limit" => d.limit = Some(limit(v)?),
                // A wrapper: `null` leaves it unset (the request's count).
                "hits_addend" if v.is_null() => d.hits_addend = None,
                "hits_addend" => {
                    d.hits_addend = Some(UInt64Value {
                        value: whole(v, "hitsAddend", u64::MAX)?,
                    })
                }
                _ => d.is_negative_hits = v.as_bool().ok_or("isNegativeHits must be a boolean")?,
            }
            Ok(())
        },
    )?;
    Ok(d)
}

fn entry(v: &Value) -> Result<Entry, String> {
    let mut e = Entry::default();
    fields(
        object(v, "an entry")?,
        &[("key", "key"), ("value", "value")],
        |name, v| {
            let s = string(v, name)?;
            if name == "key" {
                e.key = s;
            } else {
                e.value = s;
            }
            Ok(())
        },
    )?;
    Ok(e)
}

fn limit(v: &Value) -> Result<RateLimitOverride, String> {
    let mut l = RateLimitOverride::default();
    fields(
        object(v, "a limit")?,
        &[("requests_per_unit", "requestsPerUnit"), ("unit", "unit")],
        |name, v| {
            if name == "unit" {
                l.unit = match v {
                    Value::String(s) if s == "UNKNOWN" => 0,
                    Value::String(s) => Unit::parse(s)
                        .filter(|_| s.to_ascii_uppercase() == *s)
                        .ok_or("unknown unit")?
                        .proto(),
                    _ => i32::try_from(whole(v, "unit", i32::MAX as u64)?).unwrap_or(0),
                };
            } else {
                l.requests_per_unit = whole(v, "requestsPerUnit", u64::from(u32::MAX))? as u32;
            }
            Ok(())
        },
    )?;
    Ok(l)
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// Renders a response.
pub fn response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if r.overall_code != 0 {
        out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    if !r.statuses.is_empty() {
        let statuses = r.statuses.iter().map(|s| {
            let mut o = Map::new();
            if s.code != 0 {
                o.insert("code".into(), json!(code_name(s.code)));
            }
            if let Some(l) = &s.current_limit {
                let mut lo = Map::new();
                if !l.name.is_empty() {
                    lo.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    lo.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                if let Some(u) = Unit::from_proto(l.unit) {
                    lo.insert("unit".into(), json!(u.name()));
                }
                o.insert("currentLimit".into(), Value::Object(lo));
            }
            if s.limit_remaining != 0 {
                o.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                o.insert(
                    "durationUntilReset".into(),
                    json!(format!("{}s", d.seconds)),
                );
            }
            Value::Object(o)
        });
        out.insert("statuses".into(), Value::Array(statuses.collect()));
    }
    if !r.response_headers_to_add.is_empty() {
        let headers = r
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}));
        out.insert(
            "responseHeadersToAdd".into(),
            Value::Array(headers.collect()),
        );
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_camel_and_proto_names_and_refuses_unknown_fields() {
        let r = request(br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"0","limit":{"requestsPerUnit":5,"unit":"MINUTE"}}]}"#).unwrap();
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].hits_addend, Some(UInt64Value { value: 0 }));
        assert_eq!(r.descriptors[0].limit.as_ref().unwrap().unit, 2);
        assert!(request(br#"{"domain":"d","bogus":1}"#).is_err());
        assert!(request(b"not json").is_err());
        // A wrapper's null is unset; a scalar's is its default.
        let r = request(
            br#"{"domain":"d","hitsAddend":null,"descriptors":[{"entries":[],"hitsAddend":null}]}"#,
        )
        .unwrap();
        assert_eq!((r.hits_addend, r.descriptors[0].hits_addend), (0, None));
    }

    /// Integers as the proto3 JSON mapping reads them: numbers or strings,
    /// exponent notation when the value is whole, within the type. (A
    /// number in exponent form is read through an `f64`: exact up to 2^53;
    /// one beyond `f64`'s range is invalid JSON to the parser.)
    #[test]
    fn whole_numbers_at_their_edges() {
        let read = |json: &str, max| whole(&serde_json::from_str(json).unwrap(), "n", max);
        let u32max = u64::from(u32::MAX);
        for (json, n) in [
            ("0", 0),
            ("1", 1),
            ("\"7\"", 7),
            ("1e3", 1_000),
            ("\"1E3\"", 1_000),
            ("2.5e1", 25),
            ("1.0", 1),
            ("4294967295", u32max),
            ("42949672.95e2", u32max),
            ("null", 0),
        ] {
            assert_eq!(read(json, u32max), Ok(n), "{json}");
        }
        for json in [
            "4294967296",
            "-1",
            "\"-1\"",
            "1.5",
            "2.55e1",
            "1e-1",
            "\"\"",
            "\"x\"",
            "\" 1\"",
            "\"+1\"",
            "\".5\"",
            "true",
            "[]",
        ] {
            assert!(read(json, u32max).is_err(), "{json}");
        }
        assert_eq!(read("18446744073709551615", u64::MAX), Ok(u64::MAX));
        assert!(read("18446744073709551616", u64::MAX).is_err());
        assert!(read("1.8446744073709551616e19", u64::MAX).is_err());
    }
}
