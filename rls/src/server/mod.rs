//! Starting and stopping the listeners: gRPC (`GRPC_HOST:GRPC_PORT`: the
//! rate-limit service and `grpc.health.v1`), HTTP (`HOST:PORT`), debug
//! (`DEBUG_HOST:DEBUG_PORT`) and Prometheus (`PROMETHEUS_ADDR`).
//!
//! Shutdown (SIGTERM or SIGINT in [`run`]; [`Running::shutdown`] in tests)
//! first turns health unhealthy, then stops accepting; calls in flight
//! finish, for at most `RLS_SHUTDOWN_GRACE`.

mod aged;
mod banner;
mod listen;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower_throttle::clock::{Clock, SystemClock};

use crate::backend::{self, BackendError, TestHooks};
use crate::health::Health;
use crate::http::{self, Shared};
use crate::metrics::Metrics;
use crate::reload::Reloader;
use crate::service::{self, RateLimitGrpc, RateLimiter};
use crate::settings::{Backend, Settings};
use crate::tls::{ServerTls, TlsError};
use crate::xds::XdsClient;
use listen::{bind, local, Grpc};

pub use banner::START_TARGET;

/// Why the server could not start.
#[derive(Debug)]
pub enum StartError {
    /// A listener could not bind.
    Bind {
        /// Which listener (`GRPC_HOST/GRPC_PORT`, ...).
        what: &'static str,
        /// The address.
        addr: String,
        /// Why.
        error: std::io::Error,
    },
    /// The store could not be set up.
    Backend(BackendError),
    /// The gRPC TLS files cannot be used.
    Tls(TlsError),
    /// `PROMETHEUS_MAPPER_YAML` cannot be used.
    Mapper(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Bind { what, addr, error } => {
                write!(f, "{what}: cannot listen on {addr}: {error}")
            }
            StartError::Backend(e) => e.fmt(f),
            StartError::Tls(e) => e.fmt(f),
            StartError::Mapper(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for StartError {}

/// A started server.
pub struct Running {
    /// The gRPC listener's address (unspecified with `GRPC_UDS`).
    pub grpc_addr: SocketAddr,
    /// The HTTP listener's address.
    pub http_addr: SocketAddr,
    /// The debug listener's address.
    pub debug_addr: SocketAddr,
    /// The Prometheus listener's address, if enabled.
    pub metrics_addr: Option<SocketAddr>,
    /// The service.
    pub limiter: Arc<RateLimiter>,
    /// Health.
    pub health: Arc<Health>,
    /// The configuration watcher (call [`Reloader::check`] to look now);
    /// not watching with `CONFIG_TYPE=GRPC_XDS_SOTW`.
    pub reloader: Arc<Reloader>,
    /// The memory store, when it is the backend.
    pub memory: Option<tower_throttle::MemoryStore<backend::DynClock>>,
    /// The gRPC TLS configuration, with `GRPC_SERVER_USE_TLS` (call
    /// [`ServerTls::check`] to read its files again now).
    pub tls: Option<Arc<ServerTls>>,
    stop: watch::Sender<bool>,
    leases: Option<backend::leases::Leased>,
    listeners: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    grace: std::time::Duration,
}

/// Starts every listener, loads the configuration and starts watching it.
pub async fn start(settings: &Settings, mut hooks: TestHooks) -> Result<Running, StartError> {
    let manual = pin_test_clock(settings, &mut hooks);
    let tls = match &settings.grpc_tls {
        Some(t) => Some(ServerTls::load(t).map_err(StartError::Tls)?),
        None => None,
    };
    let core = Core::build(settings, hooks).await?;
    let reloader = Arc::new(Reloader::new(settings, core.limiter.clone()));
    let xds = first_configuration(settings, &reloader, &core.limiter).await;

    let grpc = Grpc::bind(settings).await?;
    let main = bind("HOST/PORT", &settings.http_addr).await?;
    let debug = bind("DEBUG_HOST/DEBUG_PORT", &settings.debug_addr).await?;
    let prometheus = match &settings.prometheus {
        Some((addr, path)) => Some((bind("PROMETHEUS_ADDR", addr).await?, path.clone())),
        None => None,
    };
    let (stop, stopped) = watch::channel(false);
    let grpc_addr = grpc.addr();
    let (http_addr, debug_addr) = (local(&main), local(&debug));
    let metrics_addr = prometheus.as_ref().map(|(l, _)| local(l));

    let (reporter, health_service) = tonic_health::server::health_reporter();
    core.health.report(&reporter).await;
    let mut background = vec![tokio::spawn(core.health.clone().drive(reporter))];
    background.push(match xds {
        Some(task) => task,
        None => tokio::spawn(reloader.clone().watch(settings.reload_interval)),
    });
    background.extend(core.watchers(settings, tls.as_ref()));

    let (age, grace) = settings.grpc_max_connection_age;
    let mut grpc_builder = tonic::transport::Server::builder();
    if !age.is_zero() {
        // The age alone: with a grace, tonic would drop the connection at
        // its end instead of sending a GOAWAY at its age (aged.rs).
        grpc_builder = grpc_builder.max_connection_age(age);
    }
    let grpc_router = grpc_builder
        .add_service(health_service)
        .add_service(RateLimitGrpc(core.limiter.clone()));
    let life = aged::life(age, grace);
    let (grpc_server, accepting) = grpc.serve(grpc_router, tls.clone(), stopped.clone(), life);
    background.extend(accepting);
    let mut listeners = vec![tokio::spawn(async move {
        if let Err(e) = grpc_server.await {
            tracing::error!(error = %e, "the gRPC server stopped");
        }
    })];
    let shared = Shared {
        limiter: core.limiter.clone(),
        health: core.health.clone(),
        test_clock: manual,
    };
    let mut routers = vec![
        (main, http::main_router(shared.clone())),
        (debug, http::debug_router(shared.clone())),
    ];
    if let Some((l, path)) = prometheus {
        routers.push((l, http::metrics_router(shared, &path)));
    }
    listeners.extend(serve_http(routers, &stopped));
    Ok(Running {
        grpc_addr,
        http_addr,
        debug_addr,
        metrics_addr,
        limiter: core.limiter,
        health: core.health,
        reloader,
        memory: core.memory,
        leases: core.leases,
        tls,
        stop,
        listeners,
        background,
        grace: settings.shutdown_grace,
    })
}

/// With `RLS_TEST_CLOCK`, a manual clock at a whole second, which the
/// store runs on unless the hooks bring their own.
fn pin_test_clock(
    settings: &Settings,
    hooks: &mut TestHooks,
) -> Option<tower_throttle::clock::ManualClock> {
    let manual = settings.test_clock.then(|| {
        let now = SystemClock::new().now_ns();
        // Whole seconds, as the hook sets them.
        tower_throttle::clock::ManualClock::starting_at(now - now % 1_000_000_000)
    });
    if let (Some(m), None) = (&manual, &hooks.clock) {
        hooks.clock = Some(Arc::new(m.clone()));
    }
    manual
}

/// The service and what it counts with.
struct Core {
    limiter: Arc<RateLimiter>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    store: tower_throttle::store::BoxStore,
    memory: Option<tower_throttle::MemoryStore<backend::DynClock>>,
    leases: Option<backend::leases::Leased>,
}

impl Core {
    async fn build(settings: &Settings, hooks: TestHooks) -> Result<Core, StartError> {
        let test_clock = hooks.clock.is_some();
        let metrics = Arc::new(match &settings.prometheus_mapper {
            Some(path) => Metrics::with_mapper_file(path).map_err(StartError::Mapper)?,
            None => Metrics::default(),
        });
        let clock: Arc<dyn Clock> = hooks.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let built = match hooks.store {
            Some(store) => backend::Built {
                store,
                healthy: true,
                memory: None,
                leases: None,
            },
            None => backend::build(settings, clock.clone(), test_clock)
                .await
                .map_err(StartError::Backend)?,
        };
        let health = Health::new(
            built.healthy,
            settings.healthy_with_at_least_one_config_loaded,
        );
        let options = service::Options {
            cache_key_prefix: settings.cache_key_prefix.clone(),
            shadow_mode: settings.shadow_mode,
            quota_mode: settings.quota_mode,
            all_or_nothing: settings.all_or_nothing,
            near_limit_ratio: settings.near_limit_ratio,
            response_headers: settings.response_headers.clone(),
            bounds: service::Bounds {
                max_descriptors: settings.max_descriptors,
                max_entries: settings.max_entries,
                max_value_bytes: settings.max_value_bytes,
            },
        };
        let limiter = Arc::new(RateLimiter::new(
            built.store.clone(),
            clock,
            options,
            metrics.clone(),
            health.clone(),
        ));
        Ok(Core {
            limiter,
            health,
            metrics,
            store: built.store,
            memory: built.memory,
            leases: built.leases,
        })
    }

    /// The tasks that watch files, export statistics and probe Redis.
    fn watchers(&self, settings: &Settings, tls: Option<&Arc<ServerTls>>) -> Vec<JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(tls) = tls {
            tasks.push(tokio::spawn(tls.clone().watch(settings.reload_interval)));
        }
        if let Some(statsd) = &settings.statsd {
            let run = crate::statsd::run(statsd.clone(), self.metrics.clone());
            tasks.push(tokio::spawn(run));
        }
        if matches!(settings.backend, Backend::Redis(_)) {
            tasks.push(tokio::spawn(backend::probe(
                self.store.clone(),
                self.health.clone(),
                std::time::Duration::from_secs(1),
            )));
        }
        tasks
    }
}

/// Loads the first configuration: the files, or the xDS client started
/// (its task returned), waiting for its first snapshot unless
/// `FORCE_START_WITHOUT_INITIAL_CONFIG`.
async fn first_configuration(
    settings: &Settings,
    reloader: &Reloader,
    limiter: &Arc<RateLimiter>,
) -> Option<JoinHandle<()>> {
    let Some((client, first)) = XdsClient::new(settings, limiter.clone()) else {
        // A bad initial config is not fatal (as upstream): requests fail
        // with "no rate limit configuration loaded" until a good one
        // arrives.
        let _ = reloader.load().await;
        return None;
    };
    let task = tokio::spawn(client.run());
    if !settings.force_start_without_initial_config {
        // Upstream's NewService: nothing listens before the first
        // snapshot is loaded (well or not).
        tracing::info!(target: START_TARGET,
            "waiting for the first rate-limit configuration from the xDS server \
             before listening (FORCE_START_WITHOUT_INITIAL_CONFIG=false)");
        first.wait().await;
    }
    Some(task)
}

/// Serves each HTTP router on its listener until `stopped`.
fn serve_http(
    routers: Vec<(tokio::net::TcpListener, axum::Router)>,
    stopped: &watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let signal = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut listeners = Vec::new();
    for (listener, router) in routers {
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let serve = axum::serve(listener, router).with_graceful_shutdown(signal(stopped.clone()));
        listeners.push(tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "an HTTP server stopped");
            }
        }));
    }
    listeners
}

impl Running {
    /// Starts shutting down: unhealthy at once, then no new connections.
    pub fn shutdown(&self) {
        self.health.stopping();
        let _ = self.stop.send(true);
    }

    /// Waits for the listeners to finish their calls in flight (at most
    /// the grace period), ends the leases (what they hold goes back), then
    /// stops the background tasks.
    pub async fn wait(self) {
        let all = futures_join(self.listeners);
        if tokio::time::timeout(self.grace, all).await.is_err() {
            tracing::warn!("calls still in flight after the shutdown grace period were dropped");
        }
        // No call is left: what the leases hold goes back (window units, and
        // upstream counts still at their counter's tail) instead of lapsing.
        if let Some(leases) = &self.leases {
            let ended = tokio::time::timeout(LEASES_GRACE, leases.shutdown()).await;
            if ended.is_err() {
                tracing::warn!("the leases' units were not all given back in time: they lapse");
            }
        }
        for task in self.background {
            task.abort();
        }
    }
}

/// How long a shutdown waits for the leases' give-backs (a store that
/// does not answer lets them lapse, which admits nothing extra).
const LEASES_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// The binary: starts, then shuts down gracefully on SIGTERM or SIGINT.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    // Handlers first: a SIGTERM right after the start line is a shutdown.
    let mut signals = Signals::install();
    // Waiting for the first xDS snapshot may be ended by a signal too.
    let running = tokio::select! {
        running = start(&settings, TestHooks::default()) => running?,
        _ = signals.recv() => {
            tracing::info!(target: START_TARGET, "stopped before serving");
            return Ok(());
        }
    };
    banner::started(&settings, &running);
    signals.recv().await;
    tracing::info!(target: START_TARGET,
        "shutting down: health is now failing, calls in flight finish");
    running.shutdown();
    running.wait().await;
    Ok(())
}

/// SIGTERM and SIGINT, listened for from the moment they are installed.
struct Signals {
    #[cfg(unix)]
    unix: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn install() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let unix = signal(SignalKind::terminate())
                .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)))
                .ok();
            Signals { unix }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some((term, int)) = &mut self.unix {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
