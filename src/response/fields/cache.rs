//! Prebuilt pieces of the common 429, so that a flood of denied requests
//! allocates nothing beyond each response's own header map, and cloning a
//! piece touches no reference count: small integers as header values, the
//! plain-text body per `Retry-After`, a layer's `RateLimit-Policy` and a
//! rule's `RateLimit` item with nothing remaining.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use http::HeaderValue;

use super::{push_u64, ratelimit_item, Params};

/// Seconds below this come from the tables (a minute-scale limit's whole
/// range); larger values are rendered per response.
pub(crate) const CACHED: u64 = 128;

/// `n` as a header value.
pub(crate) fn int_value(n: u64) -> HeaderValue {
    static SMALL: OnceLock<Box<[HeaderValue]>> = OnceLock::new();
    match usize::try_from(n).ok().filter(|&n| n < CACHED as usize) {
        Some(i) => SMALL.get_or_init(|| {
            (0..CACHED)
                .map(|n| interned(n.to_string().into_bytes()).expect("digits are a valid value"))
                .collect()
        })[i]
            .clone(),
        None => HeaderValue::from(n),
    }
}

/// The plain-text body of a 429 that may retry in `secs`.
pub(crate) fn retry_body(secs: u64) -> Bytes {
    static BODIES: OnceLock<Box<[Bytes]>> = OnceLock::new();
    let render = |secs: u64| {
        let mut s = Vec::with_capacity(48);
        s.extend_from_slice(b"Too many requests: try again in ");
        push_u64(&mut s, secs);
        s.extend_from_slice(b" s.\n");
        s
    };
    match usize::try_from(secs).ok().filter(|&s| s < CACHED as usize) {
        Some(i) => BODIES.get_or_init(|| {
            (0..CACHED)
                .map(|s| Bytes::from_static(render(s).leak()))
                .collect()
        })[i]
            .clone(),
        None => Bytes::from(render(secs)),
    }
}

/// One rule's `RateLimit` items with `r=0`, by `t`: what every 429 of a
/// one-rule layer carries. Built on the layer's first denial.
#[derive(Default)]
pub(crate) struct ExhaustedItems(OnceLock<Box<[Option<HeaderValue>]>>);

impl ExhaustedItems {
    /// `"name";r=0;t=<secs>`, if `secs` is in the table. `params` are the
    /// layer's, the same on every call.
    pub(crate) fn get(&self, params: &Params, name: &str, secs: u64) -> Option<HeaderValue> {
        let i = usize::try_from(secs)
            .ok()
            .filter(|&t| t < CACHED as usize)?;
        let items = self.0.get_or_init(|| {
            (0..CACHED)
                .map(|t| {
                    let mut s = Vec::with_capacity(name.len() + 16);
                    ratelimit_item(&mut s, params, name, 0, t, None);
                    interned(s)
                })
                .collect()
        });
        items.get(i).cloned().flatten()
    }
}

/// A header value over bytes kept for the life of the process, one copy
/// per distinct content; `None` if not a valid value. Only configuration is
/// interned (rule names, limits, windows: what layers render once), never
/// request data, so the table is bounded by the configurations a process
/// builds, however many layers repeat them.
pub(crate) fn interned(bytes: Vec<u8>) -> Option<HeaderValue> {
    static TABLE: OnceLock<Mutex<HashSet<&'static [u8]>>> = OnceLock::new();
    HeaderValue::from_bytes(&bytes).ok()?;
    let mut table = TABLE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let kept: &'static [u8] = match table.get(&bytes[..]) {
        Some(kept) => kept,
        None => {
            let kept: &'static [u8] = bytes.leak();
            table.insert(kept);
            kept
        }
    };
    HeaderValue::from_maybe_shared(Bytes::from_static(kept)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_and_rendered_values_agree() {
        for n in [0, 1, 9, 10, 99, 127, 128, 1000, u64::MAX] {
            assert_eq!(int_value(n), HeaderValue::from(n), "{n}");
            assert_eq!(
                retry_body(n),
                format!("Too many requests: try again in {n} s.\n"),
                "{n}"
            );
        }
        let a = interned(b"\"reply\";q=5;w=60".to_vec()).unwrap();
        let b = interned(b"\"reply\";q=5;w=60".to_vec()).unwrap();
        assert_eq!(a.as_bytes().as_ptr(), b.as_bytes().as_ptr(), "one copy");
        assert!(interned(b"bad\nvalue".to_vec()).is_none());
        let items = ExhaustedItems::default();
        let params = crate::response::fields::FieldProfile::default().params();
        assert_eq!(items.get(params, "reply", 0).unwrap(), "\"reply\";r=0;t=0");
        assert_eq!(
            items.get(params, "reply", 127).unwrap(),
            "\"reply\";r=0;t=127"
        );
        assert!(items.get(params, "reply", 128).is_none());
    }
}
