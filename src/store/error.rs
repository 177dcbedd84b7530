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
    /// cap and the store already holds its bound of distinct shared counters
    /// (1,024 (prefix, policy) pairs, reached only by building policies per
    /// request). A full store otherwise decides new keys on shared counters
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
    /// The backend answered, but cannot decide now: it is out of memory,
    /// busy with another client's script, loading its data, a replica, ...
    /// (see [`Outage`]). A condition that passes, like a timeout: another
    /// store may answer instead (see [`is_unavailable`](Self::is_unavailable)).
    Unavailable(Outage),
    /// The backend could not be reached or the connection broke.
    Connection(BoxError),
    /// The backend ran the script or command and it failed in a way this
    /// crate does not recognise: a defect (of this crate, or of what sits
    /// between it and the server), not an outage. The Redis stores log each
    /// distinct cause once at error level.
    Script(BoxError),
    /// A cluster could not route the command (moved, down, slots uncovered).
    Cluster(BoxError),
    /// The backend answered something this crate does not understand: a
    /// defect, logged by the Redis stores once per distinct cause at error
    /// level.
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

/// What keeps a store that answers from deciding now
/// ([`StoreError::Unavailable`]). Each is a state of the server that passes
/// (memory freed, the other script done, the data loaded, a failover
/// finished, the disk writable again, a client gone), not a defect; the
/// credential ones pass once the server or the app is given the new
/// password.
///
/// The Redis stores recognise these by the error code of the server's reply,
/// whether it answers the command itself or a command one of the crate's
/// scripts ran (`redis.call` inside `EVALSHA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outage {
    /// The server is out of memory and refuses writes (Redis `OOM`:
    /// `maxmemory` reached under `noeviction`, or with nothing left to evict).
    OutOfMemory,
    /// The server is running another client's long script or function
    /// (Redis `BUSY`).
    Busy,
    /// The server is loading its data set (Redis `LOADING`).
    Loading,
    /// The server is a read-only replica (Redis `READONLY`): a master
    /// demoted by a failover, or a URL naming a replica.
    ReadOnly,
    /// A replica cut off from its master, with `replica-serve-stale-data no`
    /// (Redis `MASTERDOWN`).
    MasterDown,
    /// The cluster cannot serve the key's slot (Redis `CLUSTERDOWN`).
    ClusterDown,
    /// The key's slot is being migrated (Redis `TRYAGAIN`).
    TryAgain,
    /// The server does not have the store's script, and loading it again did
    /// not change that (Redis `NOSCRIPT` after a reload: the script cache
    /// flushed again, or calls spread over servers behind a proxy).
    ScriptsLost,
    /// The server cannot persist to disk and refuses writes until it can
    /// (Redis `MISCONF`: an RDB save failed under
    /// `stop-writes-on-bgsave-error yes`, the default, e.g. on a full disk;
    /// or AOF writes fail).
    PersistenceFailing,
    /// Fewer replicas than `min-replicas-to-write` are connected and in
    /// time, so the server refuses writes (Redis `NOREPLICAS`).
    NoReplicas,
    /// The server has its `maxclients` connections and refused the store's
    /// new one (Redis `ERR max number of clients reached`).
    TooManyClients,
    /// The server wants credentials the store's URL lacks (Redis `NOAUTH`
    /// after connect: the server restarted with a password). A setup to
    /// fix as well: the Redis stores log it at error level with the fix.
    /// At connect it is a [`StoreError::Config`] instead.
    AuthRequired,
    /// The server refuses the store's credentials (Redis `WRONGPASS` on a
    /// reconnect: the password changed). A setup to fix as well: the Redis
    /// stores log it at error level with the fix. At connect it is a
    /// [`StoreError::Config`] instead.
    AuthRefused,
}

impl Outage {
    /// The outage a Redis error code names (`OOM`, `BUSY`, `LOADING`,
    /// `READONLY`, `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, `MISCONF`,
    /// `NOREPLICAS`, `NOAUTH`, `WRONGPASS`); `None` for any other code. For
    /// code that talks to Redis beside a store (one table for both).
    pub fn from_redis_code(code: &str) -> Option<Outage> {
        Some(match code {
            "OOM" => Outage::OutOfMemory,
            "BUSY" => Outage::Busy,
            "LOADING" => Outage::Loading,
            "READONLY" => Outage::ReadOnly,
            "MASTERDOWN" => Outage::MasterDown,
            "CLUSTERDOWN" => Outage::ClusterDown,
            "TRYAGAIN" => Outage::TryAgain,
            "MISCONF" => Outage::PersistenceFailing,
            "NOREPLICAS" => Outage::NoReplicas,
            "NOAUTH" => Outage::AuthRequired,
            "WRONGPASS" => Outage::AuthRefused,
            _ => return None,
        })
    }
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outage::OutOfMemory => "out of memory (OOM)",
            Outage::Busy => "busy running another script (BUSY)",
            Outage::Loading => "loading its data (LOADING)",
            Outage::ReadOnly => "a read-only replica (READONLY)",
            Outage::MasterDown => "a replica without its master (MASTERDOWN)",
            Outage::ClusterDown => "cluster down (CLUSTERDOWN)",
            Outage::TryAgain => "slot being migrated (TRYAGAIN)",
            Outage::ScriptsLost => "scripts not loaded (NOSCRIPT after a reload)",
            Outage::PersistenceFailing => "refusing writes: cannot persist to disk (MISCONF)",
            Outage::NoReplicas => "refusing writes: not enough replicas (NOREPLICAS)",
            Outage::TooManyClients => "refusing connections: max number of clients reached",
            Outage::AuthRequired => "wants credentials the store lacks (NOAUTH)",
            Outage::AuthRefused => "refusing the store's credentials (WRONGPASS)",
        })
    }
}

impl StoreError {
    /// True when the store cannot decide now, for a reason that passes: it
    /// could not be reached or did not answer in time
    /// ([`StoreError::Timeout`], [`StoreError::Connection`]), a cluster
    /// could not route the call ([`StoreError::Cluster`]), or the server
    /// answered that it cannot decide now ([`StoreError::Unavailable`]: out
    /// of memory, busy with another script, loading, a replica, ... see
    /// [`Outage`]). Another store may answer instead (see
    /// [`FallbackStore`](crate::store::FallbackStore)), else the layer's
    /// [`FailMode`](crate::FailMode) does.
    ///
    /// False for errors a retry elsewhere would hide: a malformed request,
    /// an unsupported policy, a misconfigured server, another program's data
    /// at a key, and defects (a reply the store does not understand:
    /// [`StoreError::Script`], [`StoreError::Protocol`]).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout(_)
                | StoreError::Connection(_)
                | StoreError::Cluster(_)
                | StoreError::Unavailable(_)
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
            StoreError::Unavailable(why) => write!(f, "rate-limit store cannot decide now: {why}"),
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

#[cfg(test)]
mod tests {
    use super::Outage;

    /// Each code names the outage whose message quotes it; anything else,
    /// a case or a space off included, names none.
    #[test]
    fn redis_codes_name_the_outage_that_quotes_them() {
        let codes = [
            "OOM",
            "BUSY",
            "LOADING",
            "READONLY",
            "MASTERDOWN",
            "CLUSTERDOWN",
            "TRYAGAIN",
            "MISCONF",
            "NOREPLICAS",
            "NOAUTH",
            "WRONGPASS",
        ];
        for code in codes {
            let outage = Outage::from_redis_code(code).expect(code);
            assert!(
                outage.to_string().ends_with(&format!("({code})")),
                "{code}: {outage}"
            );
        }
        for other in [
            "",
            "ERR",
            "oom",
            "OOM ",
            "-OOM",
            "NOSCRIPT",
            "WRONGTYPE",
            "é",
        ] {
            assert_eq!(Outage::from_redis_code(other), None, "{other:?}");
        }
    }
}
