//! Configuring a [`CellStore`]: key prefix, timeout, the eviction check and
//! TLS (the settings of [`RedisStoreBuilder`] that apply to `CL.THROTTLE`).

use std::time::Duration;

use redis::IntoConnectionInfo;

use super::{CellStore, RedisStoreBuilder, DEFAULT_PREFIX, DEFAULT_TIMEOUT};
use crate::store::StoreError;

/// Configures a [`CellStore`]; made by [`CellStore::builder`].
///
/// ```no_run
/// use std::time::Duration;
/// use tower_throttle::store::redis::CellStore;
///
/// # async fn run() -> Result<(), tower_throttle::StoreError> {
/// let store = CellStore::builder()
///     .prefix("myapp")
///     .timeout(Duration::from_millis(50))
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[must_use = "builders do nothing until used"]
pub struct CellStoreBuilder {
    prefix: String,
    timeout: Duration,
    require_safe_eviction: bool,
    #[cfg(feature = "tls")]
    tls: super::tls::Tls,
}

impl Default for CellStoreBuilder {
    /// [`DEFAULT_PREFIX`], [`DEFAULT_TIMEOUT`], eviction checked with a
    /// warning only, the system's TLS roots: the defaults of
    /// [`RedisStoreBuilder`].
    fn default() -> Self {
        CellStoreBuilder {
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            require_safe_eviction: false,
            #[cfg(feature = "tls")]
            tls: Default::default(),
        }
    }
}

/// The settings of a [`RedisStoreBuilder`] that apply to a [`CellStore`]
/// (prefix, timeout, eviction check, TLS); the others are dropped.
impl From<RedisStoreBuilder> for CellStoreBuilder {
    fn from(b: RedisStoreBuilder) -> Self {
        CellStoreBuilder {
            prefix: b.prefix,
            timeout: b.timeout,
            require_safe_eviction: b.require_safe_eviction,
            #[cfg(feature = "tls")]
            tls: b.tls,
        }
    }
}

impl CellStoreBuilder {
    /// Prefix of every key (default [`DEFAULT_PREFIX`]); no `{` or `}`.
    /// Keys are `<prefix>:<key>`, encoded as in
    /// [`RedisStore`](super::RedisStore).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Bound on every call, connecting included (default
    /// [`DEFAULT_TIMEOUT`], at least 1 ms); a call that takes longer fails
    /// with [`StoreError::Timeout`], and the next calls fail at once until
    /// the server answers a probe again (no offline queue).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(super::MIN_TIMEOUT);
        self
    }

    /// Whether connecting fails on an `allkeys-*` eviction policy (default
    /// off: a `tracing` warning); see
    /// [`RedisStoreBuilder::require_safe_eviction`].
    pub fn require_safe_eviction(mut self, on: bool) -> Self {
        self.require_safe_eviction = on;
        self
    }

    /// Trusts the CA certificate(s) in `pem` for `rediss://` URLs (feature
    /// `tls`); see [`RedisStoreBuilder::tls_root_cert`].
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.set_root_cert(pem.into());
        self
    }

    /// Authenticates with a client certificate and key, both PEM (feature
    /// `tls`); see [`RedisStoreBuilder::tls_client_cert`].
    #[cfg(feature = "tls")]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.set_client_cert(cert_pem.into(), key_pem.into());
        self
    }

    /// Connects to one server (`redis://…`, or `rediss://…` with feature
    /// `tls`), checks credentials and the eviction policy as
    /// [`RedisStoreBuilder::connect`] does (not the scripts' ACL
    /// permissions: this store runs none), then checks that the redis-cell
    /// module is loaded (`COMMAND INFO CL.THROTTLE`), failing with
    /// [`StoreError::Unsupported`] if not.
    pub async fn connect(self, info: impl IntoConnectionInfo) -> Result<CellStore, StoreError> {
        let timeout = self.timeout;
        let (conn, cfg) = self.into_redis().connect_plain(info).await?;
        let store = CellStore::new(conn, cfg.prefix, timeout);
        store.probe().await?;
        Ok(store)
    }

    /// The same settings on a [`RedisStoreBuilder`], whose connect and
    /// connect-time checks are shared.
    fn into_redis(self) -> RedisStoreBuilder {
        let b = RedisStoreBuilder::default()
            .prefix(self.prefix)
            .timeout(self.timeout)
            .require_safe_eviction(self.require_safe_eviction);
        #[cfg(feature = "tls")]
        let b = RedisStoreBuilder { tls: self.tls, ..b };
        b
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{CellStoreBuilder, RedisStoreBuilder, DEFAULT_PREFIX, DEFAULT_TIMEOUT};

    #[test]
    fn settings_carry_over_both_ways() {
        let d = CellStoreBuilder::default();
        assert_eq!(
            (d.prefix.as_str(), d.timeout),
            (DEFAULT_PREFIX, DEFAULT_TIMEOUT)
        );
        let r = RedisStoreBuilder::default();
        assert_eq!(
            (r.prefix.as_str(), r.timeout),
            (DEFAULT_PREFIX, DEFAULT_TIMEOUT)
        );
        let b: CellStoreBuilder = RedisStoreBuilder::default()
            .prefix("app")
            .timeout(Duration::from_millis(7))
            .require_safe_eviction(true)
            .into();
        assert_eq!(
            (b.prefix.as_str(), b.timeout),
            ("app", Duration::from_millis(7))
        );
        assert!(b.require_safe_eviction);
        let r = b.timeout(Duration::ZERO).into_redis();
        assert_eq!(
            (r.prefix.as_str(), r.timeout),
            ("app", Duration::from_millis(1))
        );
        assert!(r.require_safe_eviction);
    }
}
