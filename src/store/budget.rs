//! A caller's time budget for one store call, visible to the stores the
//! call goes through: a layer's
//! [`store_timeout`](crate::ThrottleLayer::store_timeout) runs its store
//! calls [`within`] it, and a [`FallbackStore`](super::FallbackStore) gives
//! its primary only part of what is left, so that its fallback answers
//! before the layer gives up.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::StoreError;

tokio::task_local! {
    /// When the innermost caller running a store call gives up on it.
    static DEADLINE: Instant;
}

/// Runs `call` within `limit`: [`StoreError::Timeout`]`(limit)` once it has
/// passed, and [`deadline`] is its end while `call` runs.
pub(crate) async fn within<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match Instant::now().checked_add(limit) {
        Some(end) => until(end, limit, call).await,
        // Beyond the clock's range: no bound at all.
        None => call.await,
    }
}

/// Runs `call` until `end` ([`StoreError::Timeout`]`(limit)` after that),
/// with [`deadline`] = `end` while it runs.
pub(crate) async fn until<T>(
    end: Instant,
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout_at(end, DEADLINE.scope(end, call))
        .await
        .unwrap_or(Err(StoreError::Timeout(limit)))
}

/// The end of the budget of the call being run, if its caller set one.
pub(crate) fn deadline() -> Option<Instant> {
    DEADLINE.try_with(|end| *end).ok()
}
