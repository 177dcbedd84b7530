//! Defects (replies this crate does not understand) logged at the store's
//! boundary, once per distinct cause.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use super::credentials::after_connect;
use crate::store::StoreError;

/// The most distinct defects logged; past it one more line says so and
/// the rest are not logged (the fail mode or the caller still sees each).
const MAX_DEFECTS_LOGGED: usize = 64;

/// The causes of the defects logged so far.
static DEFECTS_LOGGED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Logs `r`'s error at error level if it is a defect (a reply this crate
/// does not understand: [`StoreError::Script`], [`StoreError::Protocol`]),
/// once per distinct cause, not per call; returns `r`, with credentials
/// refused since the store connected made outages (logged there: see
/// [`after_connect`]). Other outages and misconfigurations are not logged
/// here: the fallback store or the layer's fail mode answers them (and the
/// layer logs each failed check).
pub(crate) fn surfaced<T>(r: Result<T, StoreError>) -> Result<T, StoreError> {
    let r = r.map_err(after_connect);
    if let Err(e @ (StoreError::Script(_) | StoreError::Protocol(_))) = &r {
        let text = e.to_string();
        if let Some(last) = first_report(cause(&text)) {
            tracing::error!(target: "tower_throttle", error = %text,
                "rate-limit store replied something this crate does not understand (a defect, \
                 not an outage, so no fallback store answers it: please report it); such calls \
                 fail (a layer answers them by its fail mode), and this cause is logged once");
            if last {
                tracing::error!(target: "tower_throttle", limit = MAX_DEFECTS_LOGGED,
                    "distinct rate-limit store defects reached the logging limit: further \
                     causes are not logged");
            }
        }
    }
    r
}

/// Whether a defect of `cause` is to be logged: `Some` the first time (and
/// `Some(true)` for the last cause the limit lets through), `None` after.
fn first_report(cause: String) -> Option<bool> {
    let mut seen = DEFECTS_LOGGED
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let seen = seen.get_or_insert_with(HashSet::new);
    if seen.len() >= MAX_DEFECTS_LOGGED || !seen.insert(cause) {
        return None;
    }
    Some(seen.len() == MAX_DEFECTS_LOGGED)
}

/// What tells two defects apart: the message with each run of digits made
/// one `#` (a count, a time or a line number does not make a new cause),
/// at most 200 bytes of it.
fn cause(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(200));
    let mut in_number = false;
    for c in text.chars() {
        if out.len() >= 200 {
            break;
        }
        if c.is_ascii_digit() {
            if !in_number {
                out.push('#');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One log line per cause (the integration tests read the lines: see
    /// `tests/redis_outages/redis_outages.rs`).
    #[test]
    fn defects_are_reported_once_per_cause() {
        let causes: Vec<String> = [1, 22, 333, 1]
            .iter()
            .map(|n| cause(&format!("unit-test defect: {n} items left")))
            .collect();
        assert!(causes.iter().all(|c| c == "unit-test defect: # items left"));
        let reported: Vec<_> = causes.into_iter().map(first_report).collect();
        assert_eq!(reported, [Some(false), None, None, None]);
        assert_eq!(
            first_report(cause("unit-test defect: another")),
            Some(false)
        );
    }
}
