//! Credentials refused after connect: the server restarted with a password
//! the URL lacks, or with another one. At connect that is a setup error
//! ([`StoreError::Config`]: the connect fails with the fix). On a running
//! store every check fails until someone fixes the server or the app: an
//! outage, so that a [`FallbackStore`](crate::store::FallbackStore) decides
//! meanwhile instead of every request failing, and logged at error level
//! with the fix (at most once a minute while it lasts), since someone has
//! to act.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::classify::{AUTH_REFUSED, AUTH_REQUIRED};
use crate::store::{Outage, StoreError};

/// The longest a refusal of the credentials goes unlogged while it lasts.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// When each of [`AuthRequired`](Outage::AuthRequired) and
/// [`AuthRefused`](Outage::AuthRefused) was last logged.
static LOGGED: Mutex<[Option<Instant>; 2]> = Mutex::new([None, None]);

/// `e` as a running store returns it: a refusal of the credentials
/// ([`StoreError::Config`] with [`AUTH_REQUIRED`] or [`AUTH_REFUSED`]) as
/// [`StoreError::Unavailable`], logged; anything else as it is.
pub(crate) fn after_connect(e: StoreError) -> StoreError {
    let (why, slot) = match &e {
        StoreError::Config(fix) if fix == AUTH_REQUIRED => (Outage::AuthRequired, 0),
        StoreError::Config(fix) if fix == AUTH_REFUSED => (Outage::AuthRefused, 1),
        _ => return e,
    };
    let log = due(
        &mut LOGGED.lock().unwrap_or_else(PoisonError::into_inner)[slot],
        Instant::now(),
    );
    match why {
        Outage::AuthRequired if log => {
            tracing::error!(target: "tower_throttle", error = %e,
                "Redis wants credentials since the rate-limit store connected (it restarted \
                 with a password?): every call fails until the server or the store's URL is \
                 fixed; logged at most once a minute");
        }
        Outage::AuthRefused if log => {
            // redis-rs's ConnectionManager does not retry a reconnect that
            // failed on anything but an I/O error.
            tracing::error!(target: "tower_throttle", error = %e,
                "Redis refused the rate-limit store's credentials on a reconnect (its password \
                 changed?): the connection does not retry that, so every call fails until the \
                 store is connected again with the right credentials; logged at most once a \
                 minute");
        }
        _ => {}
    }
    StoreError::Unavailable(why)
}

/// Whether a refusal last logged at `last` is to be logged at `now`,
/// marking it so.
fn due(last: &mut Option<Instant>, now: Instant) -> bool {
    if last.is_some_and(|at| now.saturating_duration_since(at) < LOG_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_credentials_become_outages_and_the_rest_stays() {
        let e = after_connect(StoreError::Config(AUTH_REQUIRED.to_owned()));
        assert!(matches!(e, StoreError::Unavailable(Outage::AuthRequired)));
        let e = after_connect(StoreError::Config(AUTH_REFUSED.to_owned()));
        assert!(matches!(e, StoreError::Unavailable(Outage::AuthRefused)));
        assert!(e.is_unavailable());
        // An ACL refusal is no state that passes: it stays a setup error.
        let acl = after_connect(StoreError::Config("add +evalsha".into()));
        assert!(matches!(acl, StoreError::Config(_)));
        assert!(matches!(
            after_connect(StoreError::Protocol("odd".into())),
            StoreError::Protocol(_)
        ));
    }

    /// Logged when first met, then at most once a [`LOG_EVERY`].
    #[test]
    fn logged_at_most_once_a_minute() {
        let (start, mut last) = (Instant::now(), None);
        assert!(due(&mut last, start));
        assert!(!due(&mut last, start + Duration::from_secs(59)));
        assert!(due(&mut last, start + LOG_EVERY));
        assert!(!due(&mut last, start + LOG_EVERY));
    }
}
