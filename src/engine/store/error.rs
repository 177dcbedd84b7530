//! Typed store failures, so the layer's fail-open / fail-closed policy can act on them.

use std::fmt;
use std::time::Duration;

/// A boxed error from a store's backend.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store could not decide.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The memory store could not decide a new key: its namespace is at its
    /// cap and the store already holds its bound of distinct overflow states
    /// (1,024 (prefix, policy) pairs, reached only by building policies per
    /// request). A full store otherwise decides new keys on overflow states
    /// (see [`memory`](crate::store::memory#when-the-store-is-full)) and no
    /// longer returns this.
    Full {
        /// The configured cap.
        max_keys: usize,
    },
    /// The request is malformed (for example two rules on one key in one check).
    InvalidRequest(&'static str),
    /// The store does not implement this policy.
    Unsupported(&'static str),
    /// The backend did not answer within the configured time.
    Timeout(Duration),
    /// The backend could not be reached or the connection broke.
    Connection(BoxError),
    /// The backend ran the script or command and it failed.
    Script(BoxError),
    /// A cluster could not route the command (moved, down, slots uncovered).
    Cluster(BoxError),
    /// The backend answered something this crate does not understand.
    Protocol(String),
    /// The backend's setup keeps this store from working: it wants
    /// credentials, its access rules (ACL) forbid what the store needs, or
    /// its configuration is unsafe for rate limiting. The message names the
    /// fix, and never holds a password.
    Config(String),
    /// A Redis key of this store held data the store never writes (a hash,
    /// a list, `"abc"`, `"-5"`, `"1e30"`: another program wrote there). The
    /// check failed, the key was deleted, and the next check finds it fresh,
    /// so no user stays locked out; a warning is logged with the key.
    ForeignData {
        /// The Redis key (lossy UTF-8).
        key: String,
        /// What was found there.
        found: String,
    },
}

impl StoreError {
    /// True when the store could not be reached or did not answer in time
    /// ([`StoreError::Timeout`], [`StoreError::Connection`],
    /// [`StoreError::Cluster`]): a condition that passes, where another
    /// store may answer instead (see
    /// [`FallbackStore`](crate::store::FallbackStore)). False for errors a
    /// retry elsewhere would hide (a malformed request, an unsupported
    /// policy, a misconfigured server, a failing script).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_) | StoreError::Connection(_) | StoreError::Cluster(_)
        )
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Full { max_keys } => {
                write!(f, "rate-limit store is full ({max_keys} live keys)")
            }
            StoreError::InvalidRequest(why) => write!(f, "invalid rate-limit request: {why}"),
            StoreError::Unsupported(what) => write!(f, "store does not support {what}"),
            StoreError::Timeout(after) => write!(f, "rate-limit store timed out after {after:?}"),
            StoreError::Connection(e) => write!(f, "rate-limit store connection failed: {e}"),
            StoreError::Script(e) => write!(f, "rate-limit store script failed: {e}"),
            StoreError::Cluster(e) => write!(f, "rate-limit store cluster error: {e}"),
            StoreError::Protocol(what) => {
                write!(f, "unexpected reply from rate-limit store: {what}")
            }
            StoreError::Config(fix) => write!(f, "rate-limit store misconfigured: {fix}"),
            StoreError::ForeignData { key, found } => write!(
                f,
                "rate-limit store found {found} at key {key:?} (another program's data): \
                 deleted, the key starts fresh"
            ),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Connection(e) | StoreError::Script(e) | StoreError::Cluster(e) => {
                Some(&**e)
            }
            _ => None,
        }
    }
}
