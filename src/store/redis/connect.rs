//! Connecting a configured [`RedisStoreBuilder`]: to one server or a
//! cluster, at once or lazily, and the checks every connect runs first
//! (`preflight.rs`). Sentinel is in `sentinel.rs`.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::IntoConnectionInfo;

use super::config::Config;
use super::error::{self, timed};
use super::lazy::LazyRedisClusterStore;
use super::{preflight, LazyRedisStore, RedisClusterStore, RedisStore, RedisStoreBuilder};
use crate::store::StoreError;

/// Connection and response timeouts of `t` and few reconnection retries,
/// so calls fail fast while Redis is down instead of queueing.
pub(crate) fn manager_config(t: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(Some(t))
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(t.max(Duration::from_millis(100)))
}

impl RedisStoreBuilder {
    /// Connects to one Redis server (`redis://host:port/db`, with
    /// credentials `redis://user:password@host:port/db`) through a
    /// [`ConnectionManager`] that reconnects by itself. Connection and
    /// response timeouts are the store timeout and reconnection retries are
    /// few, so calls fail fast (per the layer's fail mode) while Redis is down
    /// instead of queueing.
    ///
    /// # Connect-time checks
    ///
    /// Before returning, the store checks what would otherwise fail every
    /// request later, or silently reset quotas. Each failure is a
    /// [`StoreError::Config`] whose message names the fix and never holds a
    /// password:
    ///
    /// * **Credentials.** A server that wants a password or an ACL user the
    ///   URL lacks (`NOAUTH`), or that refuses the URL's (`WRONGPASS`).
    /// * **ACL permissions.** `SCRIPT LOAD` and `EVALSHA` of a probe script
    ///   that calls every command the scripts use, each on a key under the
    ///   prefix with arguments that change nothing (a missing key, an
    ///   unparsable number: Redis checks permissions before it runs a
    ///   command). A refused command is named with the `+command` to add; a
    ///   refused key names the pattern `~<prefix>:*`.
    /// * **Eviction.** `CONFIG GET maxmemory-policy`: `allkeys-lru`,
    ///   `allkeys-lfu` and `allkeys-random` evict keys in use, and an evicted
    ///   limiter key is a reset quota. That is a `tracing` warning, or an
    ///   error with [`require_safe_eviction`](Self::require_safe_eviction);
    ///   use `noeviction` or a `volatile-*` policy (every key this crate
    ///   writes has a TTL). `CONFIG` is not required: when it is refused the
    ///   check is skipped (logged at debug level). The policy seen is
    ///   [`RedisStore::server_eviction_policy`].
    ///
    /// # Access control
    ///
    /// The minimal ACL rule, for the default prefix `throttle` (the key
    /// pattern is `~<prefix>:*`):
    ///
    /// ```text
    /// ACL SETUSER throttle on >secret ~throttle:* +ping +evalsha +script|load +del
    ///     +time +get +mget +set +incrby +pexpire +pttl +zadd +zrem +zrange
    ///     +zrangebyscore +zremrangebyscore +zremrangebyrank +zcard +zcount
    /// ```
    ///
    /// (one line). `+time` is needed only with [`TimeSource::Server`](super::TimeSource::Server). On a
    /// cluster add `+cluster|slots` (the client reads the topology with
    /// it), on every master: ACL rules are per node. The test suite connects
    /// with exactly this rule and runs every algorithm, and drops each part
    /// in turn to see it named.
    pub async fn connect(self, info: impl IntoConnectionInfo) -> Result<RedisStore, StoreError> {
        let client = self.client(info).map_err(|e| error::map(e, self.timeout))?;
        self.connect_client(client).await
    }

    /// [`connect`](Self::connect) through a client made already.
    pub(crate) async fn connect_client(
        self,
        client: redis::Client,
    ) -> Result<RedisStore, StoreError> {
        let (conn, mut cfg) = self.open_client(client).await?;
        cfg.eviction_policy = preflight::run(&conn, &cfg, preflight::Needs::Scripts)
            .await?
            .eviction_policy;
        let store = RedisStore::with_config(conn, cfg);
        store.load_scripts().await?;
        Ok(store)
    }

    /// A store that connects in the background: returns at once, whether
    /// or not the server can be reached, and answers
    /// [`StoreError::Connection`] until a connect (with every check of
    /// [`connect`](Self::connect)) has succeeded. Meant as the primary of a
    /// [`FallbackStore`](crate::store::FallbackStore), which decides until
    /// then, so an app starts while Redis is down and moves its limits to
    /// Redis once it answers. See [`LazyRedisStore`] for the retries and
    /// what is logged.
    ///
    /// What needs no server is checked here: the URL (and its TLS
    /// settings) and the prefix. The rules are checked by
    /// [`Store::validate`](crate::Store::validate) as on a connected store,
    /// before any traffic.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the connect runs in a task of its own).
    ///
    /// ```no_run
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tower_throttle::store::{FallbackStore, RedisStore};
    /// use tower_throttle::MemoryStore;
    ///
    /// let redis = RedisStore::builder()
    ///     .timeout(Duration::from_millis(100))
    ///     .connect_lazy("redis://127.0.0.1:6379")?; // Redis may be down
    /// let store = FallbackStore::new(redis, MemoryStore::new());
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_lazy(self, info: impl IntoConnectionInfo) -> Result<LazyRedisStore, StoreError> {
        let client = self.client(info).map_err(|e| error::map(e, self.timeout))?;
        let tag = self.clone().config(false)?.tag;
        let addr = client.get_connection_info().addr().to_string();
        Ok(LazyRedisStore::spawn(
            addr,
            tag,
            Box::new(move || Box::pin(self.clone().connect_client(client.clone()))),
        ))
    }

    /// A checked connection without the scripts, for [`CellStore`].
    pub(crate) async fn connect_plain(
        self,
        info: impl IntoConnectionInfo,
    ) -> Result<(ConnectionManager, Config), StoreError> {
        let (conn, mut cfg) = self.open(info).await?;
        cfg.eviction_policy = preflight::run(&conn, &cfg, preflight::Needs::Plain)
            .await?
            .eviction_policy;
        Ok((conn, cfg))
    }

    /// A client for `info`: with the TLS settings when `rediss://`.
    pub(crate) fn client(
        &self,
        info: impl IntoConnectionInfo,
    ) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        return self.tls.client(info);
        #[cfg(not(feature = "tls"))]
        return redis::Client::open(info).map_err(no_tls);
    }

    async fn open(
        self,
        info: impl IntoConnectionInfo,
    ) -> Result<(ConnectionManager, Config), StoreError> {
        let client = self.client(info).map_err(|e| error::map(e, self.timeout))?;
        self.open_client(client).await
    }

    async fn open_client(
        self,
        client: redis::Client,
    ) -> Result<(ConnectionManager, Config), StoreError> {
        let t = self.timeout;
        let cfg = self.config(false)?;
        let conn = timed(
            t,
            ConnectionManager::new_with_config(client, manager_config(t)),
        )
        .await?;
        Ok((conn, cfg))
    }

    /// Connects to a Redis Cluster through any of its nodes. Multi-rule
    /// checks need keys with one hash tag: see [`HashTag`](super::HashTag). Runs the
    /// checks of [`connect`](Self::connect) on every master (ACL rules are
    /// per node).
    pub async fn connect_cluster<T: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<RedisClusterStore, StoreError> {
        let client = self.cluster_client(nodes)?;
        self.connect_cluster_client(client).await
    }

    /// [`connect_cluster`](Self::connect_cluster) in the background, as
    /// [`connect_lazy`](Self::connect_lazy) is to [`connect`](Self::connect):
    /// returns at once, whether or not any node can be reached (none may be
    /// up yet, or the cluster not formed), and answers
    /// [`StoreError::Connection`] until a connect with every check of
    /// [`connect_cluster`](Self::connect_cluster) has succeeded. See
    /// [`LazyRedisStore`] for the retries and what is logged.
    ///
    /// What needs no server is checked here: the nodes' URLs (and their TLS
    /// settings) and the prefix.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the connect runs in a task of its own).
    ///
    /// ```no_run
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_throttle::store::redis::{HashTag, RedisStore};
    /// use tower_throttle::store::FallbackStore;
    /// use tower_throttle::MemoryStore;
    ///
    /// let nodes = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
    /// let redis = RedisStore::builder()
    ///     .hash_tag(HashTag::PerKey)
    ///     .connect_cluster_lazy(nodes)?; // the cluster may be down
    /// let store = FallbackStore::new(redis, MemoryStore::new());
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_cluster_lazy<T: IntoConnectionInfo>(
        self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<LazyRedisClusterStore, StoreError> {
        let t = self.timeout;
        let nodes = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(|e| error::map(e, t))?;
        let addr = nodes
            .iter()
            .map(|n| n.addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let client = self.cluster_client(nodes)?;
        let tag = self.clone().config(true)?.tag;
        Ok(LazyRedisStore::spawn(
            addr,
            tag,
            Box::new(move || Box::pin(self.clone().connect_cluster_client(client.clone()))),
        ))
    }

    /// A cluster client for `nodes` (connecting to none of them).
    fn cluster_client<T: IntoConnectionInfo>(
        &self,
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<ClusterClient, StoreError> {
        let t = self.timeout;
        let client = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(t)
            .response_timeout(t)
            .retries(2);
        #[cfg(feature = "tls")]
        let client = self.tls.cluster(client);
        let client = client.build();
        #[cfg(not(feature = "tls"))]
        let client = client.map_err(no_tls);
        client.map_err(|e| error::map(e, t))
    }

    /// [`connect_cluster`](Self::connect_cluster) through a client made
    /// already.
    async fn connect_cluster_client(
        self,
        client: ClusterClient,
    ) -> Result<RedisClusterStore, StoreError> {
        let t = self.timeout;
        let mut cfg = self.config(true)?;
        let conn = timed(t, client.get_async_connection()).await?;
        cfg.eviction_policy = preflight::run(&conn, &cfg, preflight::Needs::Scripts)
            .await?
            .eviction_policy;
        let store = RedisStore::with_config(conn, cfg);
        store.load_scripts().await?;
        Ok(store)
    }
}

/// Names the missing feature when a `rediss://` URL is given without it.
#[cfg(not(feature = "tls"))]
fn no_tls(e: redis::RedisError) -> redis::RedisError {
    if e.to_string().contains("TLS") {
        return redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "rediss:// (TLS) needs the `tls` feature of tower-throttle",
        ));
    }
    e
}

/// Built without the `tls` feature (CI runs this alone: `cargo test
/// --features redis --lib without_tls`), a `rediss://` URL is refused with
/// the feature to enable, before any connection is tried.
#[cfg(all(test, not(feature = "tls")))]
mod without_tls {
    use super::RedisStoreBuilder;

    #[test]
    fn rediss_names_the_missing_feature() {
        let err = RedisStoreBuilder::default()
            .client("rediss://127.0.0.1:1/")
            .unwrap_err();
        assert!(err.to_string().contains("the `tls` feature"), "{err}");
        assert!(RedisStoreBuilder::default()
            .client("redis://127.0.0.1:1/")
            .is_ok());
    }
}
