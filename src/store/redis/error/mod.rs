//! redis-rs errors as typed [`StoreError`]s, for the layer's fail mode.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

// What a server's reply means (`classify`), credentials refused after
// connect (`credentials`), and the defects logged once (`defect`); this
// file maps an error to a `StoreError`.
mod classify;
mod credentials;
mod defect;

pub(crate) use classify::{acl_commands, ACL_DOCS};
use classify::{outage, outage_in, setup};
pub(crate) use defect::surfaced;

/// Maps a redis-rs error; `timeout` is the store's configured timeout.
///
/// Outages (the server answers that it cannot decide now: [`outage`]) are
/// [`StoreError::Unavailable`]; what this crate does not recognise is a
/// defect ([`StoreError::Script`], [`StoreError::Protocol`]), logged by
/// [`surfaced`] at the store's boundary.
pub(crate) fn map(e: RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    if let Some(fix) = setup(&e) {
        return StoreError::Config(fix);
    }
    // A refund or release that found foreign data at its key (deleted by
    // the script): the same typed, logged error as a check's.
    if e.code() == Some("FOREIGN") {
        return failed(format!("FOREIGN {}", e.detail().unwrap_or("")));
    }
    if let Some(why) = outage(&e) {
        return StoreError::Unavailable(why);
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::RESP3NotSupported => StoreError::Connection(Box::new(e)),
        // A redirection the cluster client gave up following (a slot moving
        // and moving again): the topology settles.
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            StoreError::Cluster(Box::new(e))
        }
        // `CROSSSLOT` is no outage: a multi-rule check's keys share one
        // hash tag on a cluster (refused before any traffic otherwise), so
        // it is a defect, or a store built with `cluster: false` on a
        // cluster connection. A fallback would hide it.
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(e.to_string()),
        _ => StoreError::Script(Box::new(e)),
    }
}

/// Runs `fut` under the store timeout, mapping its error.
pub(crate) async fn timed<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map_err(|e| map(e, timeout)),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

/// A check the script ran but that failed there (for example a key of
/// another type under one of its names).
#[derive(Debug)]
pub(crate) struct CheckFailed(pub String);

impl std::fmt::Display for CheckFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CheckFailed {}

/// The error of a check that failed alone. Foreign data at a key (a value of
/// another type, or a string that is no state of this crate) was deleted by
/// the script, so the key starts fresh on the next check: the error names
/// the key, and is logged here because a fail-open layer would otherwise
/// swallow it. A command the script ran that the server refused for an
/// outage (`OOM`, `READONLY`, ...: see [`outage_in`]) is
/// [`StoreError::Unavailable`]; anything else is a defect.
pub(crate) fn failed(msg: String) -> StoreError {
    match msg.strip_prefix("FOREIGN ") {
        Some(rest) => {
            let (what, key) = rest.split_once(" at ").unwrap_or((rest, ""));
            let err = StoreError::ForeignData {
                key: key.to_owned(),
                found: what.to_owned(),
            };
            tracing::warn!(%err, "rate-limit key repaired");
            err
        }
        None => match outage_in(&msg) {
            Some(why) => StoreError::Unavailable(why),
            None => StoreError::Script(Box::new(CheckFailed(msg))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Outage;

    /// The error redis-rs makes of the server's reply `line` (without `-`).
    fn reply(line: &str) -> RedisError {
        redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    fn mapped(line: &str) -> StoreError {
        map(reply(line), Duration::from_millis(5))
    }

    /// The replies of a server that cannot decide now, as Redis 7.0 words
    /// them (checked against redis-server 7.0.15), plus `CLUSTERDOWN` and
    /// `TRYAGAIN`, which only a cluster gives.
    #[test]
    fn outage_replies_are_unavailable() {
        let cases = [
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: \
                 e984b76882c219d9da245b525c16ffbd79bf8b25, on @user_script:1.",
                Outage::OutOfMemory,
            ),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or \
                 SHUTDOWN NOSAVE.",
                Outage::Busy,
            ),
            (
                "LOADING Redis is loading the dataset in memory",
                Outage::Loading,
            ),
            (
                "READONLY You can't write against a read only replica. script: \
                 756928dd1246249109cfe8475bfa267e967ea948, on @user_script:1.",
                Outage::ReadOnly,
            ),
            (
                "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                Outage::MasterDown,
            ),
            ("CLUSTERDOWN The cluster is down", Outage::ClusterDown),
            ("CLUSTERDOWN Hash slot not served", Outage::ClusterDown),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                Outage::TryAgain,
            ),
            // Every call site reloads and retries once before this.
            (
                "NOSCRIPT No matching script. Please use EVAL.",
                Outage::ScriptsLost,
            ),
            // A redis.call's write refused in a script (Redis 7.0 appends
            // where), and the server refusing a flagged script itself.
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
                 persist to disk. Commands that may modify the data set are disabled, because \
                 this instance is configured to report errors during writes if RDB snapshotting \
                 fails (stop-writes-on-bgsave-error option). Please check the Redis logs for \
                 details about the RDB error. script: e984b76882c219d9da245b525c16ffbd79bf8b25, \
                 on @user_script:1.",
                Outage::PersistenceFailing,
            ),
            (
                "MISCONF Errors writing to the AOF file: No space left on device",
                Outage::PersistenceFailing,
            ),
            (
                "NOREPLICAS Not enough good replicas to write. script: \
                 e984b76882c219d9da245b525c16ffbd79bf8b25, on @user_script:1.",
                Outage::NoReplicas,
            ),
            // No code of its own; a cluster node words it longer.
            ("ERR max number of clients reached", Outage::TooManyClients),
            (
                "ERR max number of clients + cluster connections reached",
                Outage::TooManyClients,
            ),
            // Redis 6 wraps the error of a script's redis.call.
            (
                "ERR Error running script (call to f_e984b76882c219d9da245b525c16ffbd79bf8b25): \
                 @user_script:1: @user_script: 1: -OOM command not allowed when used memory > \
                 'maxmemory'.",
                Outage::OutOfMemory,
            ),
            (
                "ERR Error running script (call to f_756928dd1246249109cfe8475bfa267e967ea948): \
                 @user_script:1: @user_script: 1: READONLY You can't write against a read only \
                 replica.",
                Outage::ReadOnly,
            ),
        ];
        for (line, why) in cases {
            let e = mapped(line);
            assert!(
                matches!(e, StoreError::Unavailable(w) if w == why) && e.is_unavailable(),
                "{line}: {e:?}"
            );
            // What a response or a log line shows names the state only.
            assert_eq!(
                e.to_string(),
                format!("rate-limit store cannot decide now: {why}")
            );
        }
    }

    /// The same codes in the message of a check a script failed on its own
    /// (a `redis.call` error the script caught).
    #[test]
    fn outage_messages_of_caught_script_errors() {
        let cases = [
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                Some(Outage::OutOfMemory),
            ),
            (
                "READONLY You can't write against a read only replica.",
                Some(Outage::ReadOnly),
            ),
            ("-BUSY Redis is busy running a script.", Some(Outage::Busy)),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                Some(Outage::TryAgain),
            ),
            (
                "MISCONF Redis is configured to save RDB snapshots, but it's currently unable \
                 to persist to disk.",
                Some(Outage::PersistenceFailing),
            ),
            (
                "NOREPLICAS Not enough good replicas to write.",
                Some(Outage::NoReplicas),
            ),
            ("ERR value is not an integer or out of range", None),
            ("user_script:12: attempt to compare nil with number", None),
            // A word of a message is no code outside a wrapped script error.
            ("ERR unknown command 'OOM'", None),
            ("", None),
        ];
        for (message, why) in cases {
            assert_eq!(outage_in(message), why, "{message}");
        }
        assert!(matches!(
            super::failed("OOM command not allowed".into()),
            StoreError::Unavailable(Outage::OutOfMemory)
        ));
    }

    /// What the crate does not understand is a defect, not an outage.
    #[test]
    fn defects_are_not_unavailable() {
        for line in [
            "ERR user_script:12: attempt to compare nil with number script: \
             e984b76882c219d9da245b525c16ffbd79bf8b25, on @user_script:12.",
            "ERR unknown command 'EVALSHA', with args beginning with:",
            "WEIRD a code nobody knows",
            "BUSYKEY Target key name already exists.",
            "EXECABORT Transaction discarded because of previous errors.",
            // Keys of two slots in one call: never sent (see `map`).
            "CROSSSLOT Keys in request don't hash to the same slot",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "UNBLOCKED client unblocked via CLIENT UNBLOCK",
            "NOTBUSY No scripts in execution right now.",
            "ERR Protocol error: invalid multibulk length",
            "NOPROTO unsupported protocol version",
        ] {
            let e = mapped(line);
            assert!(
                matches!(e, StoreError::Script(_)) && !e.is_unavailable(),
                "{line}: {e:?}"
            );
        }
        let odd = redis::RedisError::from((ErrorKind::UnexpectedReturnType, "odd reply"));
        assert!(matches!(map(odd, Duration::ZERO), StoreError::Protocol(_)));
        // Connections, redirections and timeouts stay what they were.
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(map(io, Duration::ZERO), StoreError::Connection(_)));
        assert!(matches!(
            mapped("MOVED 3999 127.0.0.1:6381"),
            StoreError::Cluster(_)
        ));
    }

    /// A setup to fix is a `Config` error naming the fix (at connect; see
    /// `credentials` for the same replies on a running store).
    #[test]
    fn setup_replies_name_the_fix() {
        for (line, says) in [
            ("NOAUTH Authentication required.", "requires a password"),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                "refused the credentials",
            ),
            (
                "ERR Protocol error: unauthenticated multibulk length",
                "requires a password",
            ),
            (
                "DENIED Redis is running in protected mode because protected mode is enabled \
                 and no password is set for the default user.",
                "protected mode",
            ),
            (
                "NOPERM User limiter has no permissions to run the 'evalsha' command",
                "+evalsha",
            ),
        ] {
            match mapped(line) {
                StoreError::Config(fix) => assert!(fix.contains(says), "{line}: {fix}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }
}
