//! redis-rs errors of upstream's `INCRBY` + `EXPIRE` as the crate's typed
//! [`StoreError`]s, so the service and `RLS_REDIS_FALLBACK=memory` treat
//! them as they treat the crate store's: an outage (a timeout, a broken
//! connection, a cluster that cannot route, a server that cannot write now)
//! is unavailable and the fallback decides; anything else fails the
//! request, as upstream's pipeline error does.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tower_throttle::store::{Outage, StoreError};

/// The error Redis answers an `INCRBY` past 2^63 − 1 with.
const OVERFLOW: &str = "increment or decrement would overflow";

/// Whether `e` is an `INCRBY` that would pass 2^63 − 1.
pub(super) fn is_overflow(e: &RedisError) -> bool {
    e.to_string().contains(OVERFLOW)
}

/// The server's error codes in `e` (one per failed command of a pipeline).
fn codes(e: &RedisError) -> Vec<String> {
    match e.clone().into_server_errors() {
        Some(errors) => errors.iter().map(|(_, s)| s.code().to_owned()).collect(),
        None => e.code().map(str::to_owned).into_iter().collect(),
    }
}

/// Maps an error of the pipeline; `timeout` is `REDIS_TIMEOUT`.
pub(super) fn map(e: RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    let codes = codes(&e);
    if codes.iter().any(|c| c == "NOPERM") {
        return StoreError::Config(
            "the Redis user may not run INCRBY or EXPIRE, which upstream-format limits \
             need (RLS_REDIS_KEYS=upstream): allow +incrby +expire on the counter keys"
                .into(),
        );
    }
    if let Some(why) = codes.iter().find_map(|c| Outage::from_redis_code(c)) {
        return StoreError::Unavailable(why);
    }
    if e.to_string().contains("max number of clients") {
        return StoreError::Unavailable(Outage::TooManyClients);
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel
        | ErrorKind::EmptySentinelList => StoreError::Connection(Box::new(e)),
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            StoreError::Cluster(Box::new(e))
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => StoreError::Protocol(e.to_string()),
        // WRONGTYPE, a value that is no integer, ...: another program's
        // data at a counter key. Upstream fails the request too.
        _ => StoreError::Script(Box::new(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.into(), Some(detail.into()))
    }

    #[test]
    fn outages_are_unavailable_and_the_rest_fail_the_request() {
        let t = Duration::from_millis(5);
        for code in ["OOM", "READONLY", "LOADING", "MISCONF", "NOREPLICAS"] {
            let e = map(server(code, "x"), t);
            assert!(e.is_unavailable(), "{code}: {e}");
        }
        let e = map(server("WRONGTYPE", "Operation against a key"), t);
        assert!(!e.is_unavailable() && matches!(e, StoreError::Script(_)));
        let e = map(server("NOPERM", "no INCRBY"), t);
        assert!(matches!(e, StoreError::Config(_)), "{e}");
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(map(io, t).is_unavailable());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(map(io, t), StoreError::Timeout(d) if d == t));
        assert!(is_overflow(&server("ERR", OVERFLOW)));
        assert!(!is_overflow(&server("ERR", "value is not an integer")));
    }
}
