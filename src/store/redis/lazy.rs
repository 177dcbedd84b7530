//! A Redis store that connects in the background:
//! [`connect_lazy`](super::RedisStoreBuilder::connect_lazy), and its
//! cluster and Sentinel kin
//! ([`connect_cluster_lazy`](super::RedisStoreBuilder::connect_cluster_lazy),
//! [`connect_sentinel_lazy`](super::RedisStoreBuilder::connect_sentinel_lazy)).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;

use super::{validate, HashTag, RedisStore, SentinelConnection};
use crate::decision::PermitId;
use crate::policy::Policy;
use crate::store::{Answer, Charge, Decisions, Namespaces, RuleSpec, Store, StoreError};

/// The wait before the second connect attempt; it doubles after each
/// failure, up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between connect attempts.
const MAX_RETRY: Duration = Duration::from_secs(2);

/// A [`RedisStore`] that connects in the background, made by
/// [`RedisStoreBuilder::connect_lazy`](super::RedisStoreBuilder::connect_lazy)
/// (one server),
/// [`connect_cluster_lazy`](super::RedisStoreBuilder::connect_cluster_lazy) (a
/// cluster: [`LazyRedisClusterStore`]) or
/// [`connect_sentinel_lazy`](super::RedisStoreBuilder::connect_sentinel_lazy) (a
/// Sentinel-managed master: [`LazyRedisSentinelStore`]). Until a connect has
/// succeeded every call fails with [`StoreError::Connection`] at once (so
/// the fallback of a [`FallbackStore`](crate::store::FallbackStore) decides,
/// and a layer alone applies its fail mode); then every call goes to the
/// connected store.
///
/// # Retries
///
/// The connect is tried at once, then again after 100 ms, the wait doubling
/// after each failure up to 2 s, until it succeeds or every clone of the
/// store is dropped. Each attempt is a full connect of its kind
/// ([`connect`](super::RedisStoreBuilder::connect),
/// [`connect_cluster`](super::RedisStoreBuilder::connect_cluster),
/// [`connect_sentinel`](super::RedisStoreBuilder::connect_sentinel)), bounded as
/// it is by the store timeout, with its checks (credentials, ACL
/// permissions, eviction policy, on every master of a cluster) and the
/// scripts loaded.
///
/// # What is logged
///
/// Each change of state once (target `tower_throttle`), not each attempt:
///
/// * the server cannot be reached (a refused connection, a timeout, no
///   sentinel answering, a master the sentinels see down) or cannot serve
///   now (an [`Outage`](crate::store::Outage): loading, at `maxclients`,
///   ...): a warning, once until the state changes;
/// * the server answers but refuses this store's setup (wrong or missing
///   credentials, an ACL without a command the scripts need, an `allkeys-*`
///   eviction policy with
///   [`require_safe_eviction`](super::RedisStoreBuilder::require_safe_eviction)):
///   an **error** with the fix, once per distinct error. The store keeps
///   answering [`StoreError::Connection`] (its message holds the fix), so a
///   fallback keeps deciding rather than every request failing, and it
///   keeps retrying: once the server's setup is fixed, it connects without
///   a restart;
/// * connected: a warning after failures (info on the first attempt).
///
/// Clones share the connection and its attempts.
pub struct LazyRedisStore<C = ConnectionManager> {
    shared: Arc<LazyShared<C>>,
}

/// A [`LazyRedisStore`] on a Redis Cluster, made by
/// [`RedisStoreBuilder::connect_cluster_lazy`](super::RedisStoreBuilder::connect_cluster_lazy).
pub type LazyRedisClusterStore = LazyRedisStore<ClusterConnection>;

/// A [`LazyRedisStore`] on the master of a Sentinel-monitored group, made by
/// [`RedisStoreBuilder::connect_sentinel_lazy`](super::RedisStoreBuilder::connect_sentinel_lazy).
pub type LazyRedisSentinelStore = LazyRedisStore<SentinelConnection>;

/// One connect attempt: the eager connect of the store's kind.
pub(super) type Attempt<C> = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<RedisStore<C>, StoreError>> + Send>>
        + Send
        + Sync,
>;

impl<C> Clone for LazyRedisStore<C> {
    fn clone(&self) -> Self {
        LazyRedisStore {
            shared: self.shared.clone(),
        }
    }
}

struct LazyShared<C> {
    store: OnceLock<RedisStore<C>>,
    /// What is connected to (addresses, never credentials), for messages:
    /// `127.0.0.1:6379`; a cluster's nodes; a master's name and sentinels.
    addr: String,
    /// The rules are checked as the connected store would.
    tag: HashTag,
    /// Given to the connected store, so that layers built before and after
    /// share one registry.
    namespaces: Namespaces,
    /// The last attempt's error, for the error calls answer with.
    last: Mutex<Option<String>>,
}

impl<C> fmt::Debug for LazyRedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyRedisStore")
            .field("addr", &self.shared.addr)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl<C> LazyRedisStore<C>
where
    C: Send + Sync + 'static,
{
    /// Starts connecting to `addr` (for messages) by `attempt`s; `tag`
    /// checks the rules as the connected store will.
    pub(super) fn spawn(addr: String, tag: HashTag, attempt: Attempt<C>) -> Self {
        let shared = Arc::new(LazyShared {
            store: OnceLock::new(),
            addr,
            tag,
            namespaces: Namespaces::default(),
            last: Mutex::new(None),
        });
        tokio::spawn(connect(Arc::downgrade(&shared), attempt));
        LazyRedisStore { shared }
    }
}

impl<C> LazyRedisStore<C> {
    /// The connected store, once a connect has succeeded.
    pub fn connected(&self) -> Option<&RedisStore<C>> {
        self.shared.store.get()
    }

    /// Whether a connect has succeeded (calls go to Redis from then on).
    pub fn is_connected(&self) -> bool {
        self.connected().is_some()
    }

    fn not_connected(&self) -> StoreError {
        let last = self
            .shared
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let why = match &*last {
            Some(e) => format!(
                "Redis at {} is not connected yet (retrying in the background; last attempt: {e})",
                self.shared.addr
            ),
            None => format!(
                "Redis at {} is not connected yet (connecting in the background)",
                self.shared.addr
            ),
        };
        StoreError::Connection(why.into())
    }
}

/// Tries to connect until it succeeds or the store is dropped.
async fn connect<C>(shared: Weak<LazyShared<C>>, attempt: Attempt<C>) {
    let mut wait = FIRST_RETRY;
    let mut report = Report::default();
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        let attempt = attempt().await;
        let Some(lazy) = shared.upgrade() else { return };
        match attempt {
            Ok(mut store) => {
                store.namespaces = lazy.namespaces.clone();
                let _ = lazy.store.set(store);
                if report.seen == Seen::Nothing {
                    tracing::info!(target: "tower_throttle", addr = %lazy.addr,
                        "connected to Redis: the rate-limit store decides");
                } else {
                    tracing::warn!(target: "tower_throttle", addr = %lazy.addr,
                        "connected to Redis at last: the rate-limit store decides from now on");
                }
                return;
            }
            Err(e) => {
                match report.failed(&e) {
                    Some(tracing::Level::ERROR) => {
                        tracing::error!(target: "tower_throttle", addr = %lazy.addr, error = %e,
                            "Redis refuses this rate-limit store's setup: not connected, \
                             retrying in the background (calls to this store fail meanwhile)");
                    }
                    Some(_) => {
                        tracing::warn!(target: "tower_throttle", addr = %lazy.addr, error = %e,
                            "cannot reach Redis, or it cannot serve now: not connected, \
                             retrying in the background (calls to this store fail meanwhile)");
                    }
                    None => {}
                }
                *lazy.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
            }
        }
        drop(lazy);
        tokio::time::sleep(wait).await;
        wait = next_wait(wait);
    }
}

/// The wait after `wait`: twice as long, at most [`MAX_RETRY`].
fn next_wait(wait: Duration) -> Duration {
    (wait * 2).min(MAX_RETRY)
}

/// What the attempts have logged, so that each state is logged once.
#[derive(Debug, Default)]
struct Report {
    seen: Seen,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum Seen {
    #[default]
    Nothing,
    /// The server could not be reached.
    Unreachable,
    /// The server refused the setup, with this error.
    Refused(String),
}

impl Report {
    /// The level to log a failed attempt at, or `None` when its state has
    /// been logged already: a warning for an unreachable server, an error
    /// for each distinct refusal of the setup.
    fn failed(&mut self, e: &StoreError) -> Option<tracing::Level> {
        let (now, level) = if e.is_unavailable() {
            (Seen::Unreachable, tracing::Level::WARN)
        } else {
            (Seen::Refused(e.to_string()), tracing::Level::ERROR)
        };
        if self.seen == now {
            return None;
        }
        self.seen = now;
        Some(level)
    }
}

impl<C> Store for LazyRedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn namespaces(&self) -> Option<&Namespaces> {
        Some(&self.shared.namespaces)
    }

    /// What [`RedisStore`] refuses before any traffic, connected or not.
    fn validate(&self, rules: &[RuleSpec<'_>]) -> Result<(), StoreError> {
        validate::rules(rules, &self.shared.tag, false)
    }

    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        match self.connected() {
            Some(store) => store.decide(charges),
            None => Answer::Now(Err(self.not_connected())),
        }
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &Policy,
        receipt: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        match self.connected() {
            Some(store) => store.refund(key, policy, receipt).await,
            None => Err(self.not_connected()),
        }
    }

    async fn reset(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        match self.connected() {
            Some(store) => store.reset(key, policy).await,
            None => Err(self.not_connected()),
        }
    }

    async fn release(
        &self,
        key: &[u8],
        policy: &Policy,
        permit: PermitId,
    ) -> Result<(), StoreError> {
        match self.connected() {
            Some(store) => store.release(key, policy, permit).await,
            None => Err(self.not_connected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_back_off_from_100_ms_to_2_s() {
        let waits: Vec<u128> = std::iter::successors(Some(FIRST_RETRY), |w| Some(next_wait(*w)))
            .take(8)
            .map(|w| w.as_millis())
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
    }

    /// Each state is logged once, however many attempts fail in it: an
    /// unreachable server at warning level, each distinct refusal of the
    /// setup at error level.
    #[test]
    fn each_state_is_logged_once() {
        let mut r = Report::default();
        let down = || StoreError::Connection("connection refused".into());
        let noauth = || StoreError::Config("wants a password".into());
        let acl = || StoreError::Config("add +evalsha".into());
        assert_eq!(r.failed(&down()), Some(tracing::Level::WARN));
        assert_eq!(r.failed(&down()), None);
        assert_eq!(r.failed(&StoreError::Timeout(FIRST_RETRY)), None);
        assert_eq!(r.failed(&noauth()), Some(tracing::Level::ERROR));
        assert_eq!(r.failed(&noauth()), None);
        assert_eq!(r.failed(&acl()), Some(tracing::Level::ERROR));
        assert_eq!(r.failed(&acl()), None);
        assert_eq!(r.failed(&down()), Some(tracing::Level::WARN));
    }
}
