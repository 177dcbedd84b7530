//! The store behind the service, from the settings: the crate's memory
//! store, or its Redis stores (single, Sentinel, Cluster; TLS), optionally
//! behind a fallback to memory (`RLS_REDIS_FALLBACK=memory`). On Redis,
//! upstream-format limits count under upstream's keys with its commands
//! (`RLS_REDIS_KEYS=upstream`, the default): see [`UpstreamCounters`].

pub(crate) mod join;
pub mod leases;
mod redis_errors;
mod upstream_keys;
mod url;

use std::sync::Arc;
use std::time::Duration;

use tower_throttle::clock::Clock;
use tower_throttle::store::redis::{HashTag, RedisStoreBuilder, TimeSource};
use tower_throttle::store::{BoxStore, FallbackStore, StoreError};
use tower_throttle::MemoryStore;

use crate::settings::{Backend, Leases, RedisKeys, RedisSettings, RedisType, Settings};
use upstream_keys::Conn;
pub use upstream_keys::{counter_seconds, UpstreamCounters, COUNTER_MAX};

/// A shared clock as a [`Clock`] (the store builders take a sized clock).
#[derive(Clone)]
pub struct DynClock(pub Arc<dyn Clock>);

impl Clock for DynClock {
    fn now_ns(&self) -> u64 {
        self.0.now_ns()
    }
}

/// How the store was made, for tests: a clock to run on instead of the
/// system's (the memory store's clock; Redis scripts then take `now` from
/// it too, [`TimeSource::Client`]).
#[derive(Clone, Default)]
pub struct TestHooks {
    /// The clock.
    pub clock: Option<Arc<dyn Clock>>,
    /// A store to use instead of the one the settings describe.
    pub store: Option<BoxStore>,
}

/// Why no store could be made: the setting and the reason, no secret.
#[derive(Debug)]
pub struct BackendError(pub String);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BackendError {}

/// The store made from the settings.
pub struct Built {
    /// The store the service counts in.
    pub store: BoxStore,
    /// Whether it starts healthy (a Redis store connects in the background
    /// and is unhealthy until it answers).
    pub healthy: bool,
    /// The memory store, when it is the backend (to see its size).
    pub memory: Option<MemoryStore<DynClock>>,
    /// The leases, with `RLS_LEASES=on`: ended at shutdown, so that what
    /// they hold goes back before the process exits.
    pub leases: Option<leases::Leased>,
}

/// Makes the store.
pub async fn build(
    settings: &Settings,
    clock: Arc<dyn Clock>,
    test_clock: bool,
) -> Result<Built, BackendError> {
    let memory = || {
        MemoryStore::builder()
            .clock(DynClock(clock.clone()))
            .max_keys(settings.memory_max_keys)
            .build()
    };
    let r = match &settings.backend {
        Backend::Memory => {
            let m = memory();
            return Ok(Built {
                store: BoxStore::new(m.clone()),
                healthy: true,
                memory: Some(m),
                leases: None,
            });
        }
        Backend::Redis(r) => r,
    };
    let mut builder = RedisStoreBuilder::default().timeout(r.timeout);
    if test_clock {
        // A frozen test clock: keys must outlive the real time a test takes.
        builder = builder
            .time_source(TimeSource::Client(Arc::new(DynClock(clock.clone()))))
            .ttl_padding(Duration::from_secs(3_600));
    }
    builder = tls(builder, r)?;
    let fail =
        |what: &str, e: StoreError| BackendError(format!("REDIS_URL: cannot use the {what}: {e}"));
    // Upstream's counters, unless the crate's keys are asked for or every
    // limit goes through the all-or-nothing script.
    let upstream = settings.redis_keys == RedisKeys::Upstream && !settings.all_or_nothing;
    let counters = |conn: Conn, inner: BoxStore| {
        if !upstream {
            return inner;
        }
        let jitter = settings.expiration_jitter_max_seconds;
        BoxStore::new(UpstreamCounters::new(conn, inner, jitter, r.timeout))
    };
    let store = match r.redis_type {
        RedisType::Single => {
            let info = url::single(r)?;
            let lazy = builder
                .connect_lazy(info)
                .map_err(|e| fail("Redis server", e))?;
            let store = counters(Conn::Single(lazy.clone()), BoxStore::new(lazy));
            // Unhealthy until it answers, unless the fallback decides.
            return Ok(built(settings, &clock, store, memory(), false));
        }
        RedisType::Cluster => {
            if settings.all_or_nothing {
                // One multi-rule check needs one slot.
                builder = builder.hash_tag(HashTag::Fixed("rls".into()));
            }
            let nodes = url::nodes(r)?;
            let store = builder
                .connect_cluster(nodes)
                .await
                .map_err(|e| fail("Redis Cluster", e))?;
            counters(
                Conn::Cluster(store.connection().clone()),
                BoxStore::new(store),
            )
        }
        RedisType::Sentinel => {
            let (master, sentinels) = url::sentinels(r)?;
            if !r.auth.is_empty() {
                let (user, password) = url::split_auth(&r.auth);
                builder = builder.sentinel_master_auth(user, password);
            }
            let store = builder
                .connect_sentinel(sentinels, &master)
                .await
                .map_err(|e| fail("Redis Sentinel master", e))?;
            counters(
                Conn::Sentinel(store.connection().clone()),
                BoxStore::new(store),
            )
        }
    };
    Ok(built(settings, &clock, store, memory(), true))
}

/// The Redis store, behind the memory fallback if asked for, behind leases
/// if on (over the fallback, so that its decisions end them).
fn built(
    settings: &Settings,
    clock: &Arc<dyn Clock>,
    mut store: BoxStore,
    memory: MemoryStore<DynClock>,
    mut healthy: bool,
) -> Built {
    if matches!(&settings.backend, Backend::Redis(r) if r.fallback_to_memory) {
        store = BoxStore::new(FallbackStore::new(store, memory));
        healthy = true;
    }
    let mut leased = None;
    if settings.leases == Leases::On {
        let tail = settings.redis_keys == RedisKeys::Upstream && !settings.all_or_nothing;
        let leases = leases::Leased::new(store, DynClock(clock.clone()), tail);
        store = BoxStore::new(leases.clone());
        leased = Some(leases);
    }
    Built {
        store,
        healthy,
        memory: None,
        leases: leased,
    }
}

fn tls(
    mut builder: RedisStoreBuilder,
    r: &RedisSettings,
) -> Result<RedisStoreBuilder, BackendError> {
    let read = |name: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| BackendError(format!("{name}: cannot read {}: {e}", path.display())))
    };
    if let Some(ca) = &r.tls_ca_cert {
        builder = builder.tls_root_cert(read("REDIS_TLS_CACERT", ca)?);
    }
    if let Some((cert, key)) = &r.tls_client {
        builder = builder.tls_client_cert(
            read("REDIS_TLS_CLIENT_CERT", cert)?,
            read("REDIS_TLS_CLIENT_KEY", key)?,
        );
    }
    Ok(builder)
}

/// Keeps the store's health current: a peek every `every`.
pub async fn probe(store: BoxStore, health: Arc<crate::health::Health>, every: Duration) {
    use tower_throttle::store::{Charge, Store};
    let Ok(policy) = tower_throttle::Policy::fixed_window(1, Duration::from_secs(1)) else {
        return;
    };
    loop {
        match store
            .check(Charge::new(b"rls_health_probe", &policy, 0))
            .await
        {
            Ok(_) => health.store_ok(),
            Err(e) => {
                tracing::warn!(error = %e, "the rate-limit store is unhealthy");
                health.store_failed();
            }
        }
        tokio::time::sleep(every).await;
    }
}
