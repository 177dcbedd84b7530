//! redis-rs errors as typed [`StoreError`]s, for the layer's fail mode.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::StoreError;

/// Maps a redis-rs error; `timeout` is the store's configured timeout.
pub(crate) fn map(e: RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    match e.kind() {
        ErrorKind::Io
        | ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Client
        | ErrorKind::RESP3NotSupported
        | ErrorKind::Server(ServerErrorKind::BusyLoading) => StoreError::Connection(Box::new(e)),
        ErrorKind::ClusterConnectionNotFound
        | ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreError::Cluster(Box::new(e)),
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
