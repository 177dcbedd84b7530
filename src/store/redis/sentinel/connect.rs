//! Connecting through Redis Sentinel: [`RedisStoreBuilder::connect_sentinel`],
//! its lazy kin, and the builder's Sentinel settings.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Client, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisResult};

use super::{master_client, RedisSentinelStore, SentinelConnection, SentinelShared};
use crate::store::redis::error::{self, timed};
use crate::store::redis::lazy::LazyRedisSentinelStore;
use crate::store::redis::{preflight, LazyRedisStore, RedisStore, RedisStoreBuilder};
use crate::store::StoreError;

impl RedisStoreBuilder {
    /// Connects through Redis Sentinel: asks the `sentinels` (any of them
    /// answering will do) for the master of the group named `master_name`,
    /// runs the checks of [`connect`](Self::connect) on it, and follows a
    /// failover to the master they name next (see [`SentinelConnection`]).
    ///
    /// The sentinels' URLs carry the sentinels' own credentials, if any; the
    /// master's are [`sentinel_master_auth`](Self::sentinel_master_auth).
    /// During a failover a call made while no master answers fails (per the
    /// layer's fail mode; in `tests/redis_topologies/redis_sentinel.rs` the switch took under
    /// a second and no call failed), and admissions the old master acknowledged but had
    /// not yet replicated are lost (replication is asynchronous).
    pub async fn connect_sentinel<T: IntoConnectionInfo>(
        self,
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<RedisSentinelStore, StoreError> {
        let sentinels = self.sentinel_infos(sentinels)?;
        self.connect_sentinel_with(sentinels, master_name.to_owned())
            .await
    }

    /// [`connect_sentinel`](Self::connect_sentinel) in the background, as
    /// [`connect_lazy`](Self::connect_lazy) is to [`connect`](Self::connect):
    /// returns at once, whether or not the sentinels or the master can be
    /// reached (none may be up yet), and answers [`StoreError::Connection`]
    /// until a connect with every check of
    /// [`connect_sentinel`](Self::connect_sentinel) has succeeded; then it
    /// follows failovers as that store does. See [`LazyRedisStore`] for the
    /// retries and what is logged (sentinels that know no master of that
    /// name are a setup error, logged as such; a master they see down is
    /// waited for).
    ///
    /// What needs no server is checked here: the sentinels' URLs and the
    /// prefix.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (the connect runs in a task of its own).
    ///
    /// ```no_run
    /// # #[tokio::main]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_throttle::store::redis::RedisStore;
    /// use tower_throttle::store::FallbackStore;
    /// use tower_throttle::MemoryStore;
    ///
    /// let sentinels = ["redis://127.0.0.1:26379", "redis://127.0.0.1:26380"];
    /// let redis = RedisStore::builder().connect_sentinel_lazy(sentinels, "mymaster")?;
    /// let store = FallbackStore::new(redis, MemoryStore::new());
    /// # let _ = store;
    /// # Ok(())
    /// # }
    /// ```
    pub fn connect_sentinel_lazy<T: IntoConnectionInfo>(
        self,
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<LazyRedisSentinelStore, StoreError> {
        let sentinels = self.sentinel_infos(sentinels)?;
        // Refused here rather than at every attempt.
        self.sentinel_client(&sentinels, master_name)?;
        let tag = self.clone().config(false)?.tag;
        let addr = format!(
            "{master_name} via sentinels {}",
            sentinels
                .iter()
                .map(|s| s.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let master_name = master_name.to_owned();
        Ok(LazyRedisStore::spawn(
            addr,
            tag,
            Box::new(move || {
                Box::pin(
                    self.clone()
                        .connect_sentinel_with(sentinels.clone(), master_name.clone()),
                )
            }),
        ))
    }

    /// The sentinels' connection infos.
    fn sentinel_infos<T: IntoConnectionInfo>(
        &self,
        sentinels: impl IntoIterator<Item = T>,
    ) -> Result<Vec<ConnectionInfo>, StoreError> {
        sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()
            .map_err(|e| error::map(e, self.timeout))
    }

    /// A client asking `sentinels` for the master `master_name` (connecting
    /// to none of them), with the master's credentials.
    fn sentinel_client(
        &self,
        sentinels: &[ConnectionInfo],
        master_name: &str,
    ) -> Result<SentinelClient, StoreError> {
        let mut node = SentinelNodeConnectionInfo::default();
        if let Some(crate::store::redis::builder::MasterAuth(user, password)) = &self.sentinel_auth
        {
            let mut info = redis::RedisConnectionInfo::default().set_password(password);
            if let Some(user) = user {
                info = info.set_username(user);
            }
            node = node.set_redis_connection_info(info);
        }
        // redis-rs takes a `String` here without its TLS feature, `impl
        // AsRef<str>` with it.
        #[allow(clippy::unnecessary_to_owned)]
        SentinelClient::build(
            sentinels.to_vec(),
            master_name.to_owned(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| error::map(e, self.timeout))
    }

    /// [`connect_sentinel`](Self::connect_sentinel) to sentinels parsed
    /// already.
    async fn connect_sentinel_with(
        self,
        sentinels: Vec<ConnectionInfo>,
        master_name: String,
    ) -> Result<RedisSentinelStore, StoreError> {
        let t = self.timeout;
        let mut client = self.sentinel_client(&sentinels, &master_name)?;
        let config = crate::store::redis::connect::manager_config(t);
        let master = match master_client(&mut client, t).await {
            Ok(master) => master,
            Err(e)
                if e.kind() == ErrorKind::MasterNameNotFoundBySentinel
                    || e.to_string().contains("MasterNameNotFound") =>
            {
                return Err(no_master(&sentinels, &master_name, t).await);
            }
            Err(e) => return Err(error::map(e, t)),
        };
        let addr = master.get_connection_info().addr().to_string();
        let conn = timed(
            t,
            ConnectionManager::new_with_config(master, config.clone()),
        )
        .await?;
        let conn = SentinelConnection {
            inner: Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(client),
                current: RwLock::new((0, addr, conn)),
                config,
                timeout: t,
                master: master_name,
            }),
        };
        conn.poll(self.sentinel_poll);
        let mut cfg = self.config(false)?;
        cfg.eviction_policy = preflight::run(&conn, &cfg, preflight::Needs::Scripts)
            .await?
            .eviction_policy;
        let store = RedisStore::with_config(conn, cfg);
        store.load_scripts().await?;
        Ok(store)
    }

    /// How often a [`connect_sentinel`](Self::connect_sentinel) store asks
    /// the sentinels which server is the master (default 1 s, at least
    /// 10 ms): after a failover, the admissions the demoted master takes
    /// until then are lost.
    pub fn sentinel_poll_interval(mut self, every: Duration) -> Self {
        self.sentinel_poll = every.max(Duration::from_millis(10));
        self
    }

    /// The master's credentials for [`connect_sentinel`](Self::connect_sentinel)
    /// (an ACL user, or `None` for the default user, and its password).
    pub fn sentinel_master_auth(mut self, username: Option<&str>, password: &str) -> Self {
        self.sentinel_auth = Some(crate::store::redis::builder::MasterAuth(
            username.map(str::to_owned),
            password.to_owned(),
        ));
        self
    }
}

/// Why no sentinel named a master `name`: sentinels that know the name
/// (they answer `SENTINEL GET-MASTER-ADDR-BY-NAME` with an address) see it
/// down or not yet a master, which passes ([`StoreError::Connection`]);
/// sentinels that all know nothing of it are set up for another name
/// ([`StoreError::Config`]).
async fn no_master(sentinels: &[ConnectionInfo], name: &str, t: Duration) -> StoreError {
    for info in sentinels {
        let Ok(client) = Client::open(info.clone()) else {
            continue;
        };
        let asked = tokio::time::timeout(t, async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(name)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        });
        if let Ok(Ok(Some((host, port)))) = asked.await {
            return StoreError::Connection(
                format!(
                    "the sentinels know master `{name}` (last at {host}:{port}) but none sees \
                     it up as a master now"
                )
                .into(),
            );
        }
    }
    StoreError::Config(format!(
        "the sentinels monitor no master named `{name}`: use the name of their \
         `sentinel monitor <name> ...` line"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connecting can be spawned.
    #[test]
    fn connect_future_is_send() {
        fn send<T: Send>(_: T) {}
        send(RedisStore::builder().connect_sentinel(["redis://127.0.0.1:1/"], "m"));
    }

    #[test]
    fn master_credentials_are_never_printed() {
        let b = RedisStore::builder().sentinel_master_auth(Some("app"), "hunter2");
        assert!(!format!("{b:?}").contains("hunter2"));
    }
}
