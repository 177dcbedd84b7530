//! Health as upstream's `HealthChecker` keeps it: components that must all
//! be OK (the store; not yet shutting down; with
//! `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`, a loaded config). It answers
//! `GET /healthcheck` and the gRPC health service `ratelimit`; service `""`
//! stays SERVING, as grpc-go's default does upstream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The gRPC health service name upstream registers.
pub const SERVICE: &str = "ratelimit";

/// The health components.
#[derive(Debug)]
pub struct Health {
    store: AtomicBool,
    config: AtomicBool,
    need_config: bool,
    stopping: AtomicBool,
    changed: Notify,
}

impl Health {
    /// `store_ok`: whether the store starts healthy (a Redis store starts
    /// unhealthy until it answers); `need_config`: whether a loaded
    /// config is a component.
    pub fn new(store_ok: bool, need_config: bool) -> Arc<Health> {
        Arc::new(Health {
            store: AtomicBool::new(store_ok),
            config: AtomicBool::new(!need_config),
            need_config,
            stopping: AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    /// Whether every component is OK.
    pub fn is_healthy(&self) -> bool {
        self.store.load(Ordering::SeqCst)
            && self.config.load(Ordering::SeqCst)
            && !self.stopping.load(Ordering::SeqCst)
    }

    /// Sets a component; whether it changed.
    fn set(&self, flag: &AtomicBool, value: bool) -> bool {
        let changed = flag.swap(value, Ordering::SeqCst) != value;
        if changed {
            self.changed.notify_one();
        }
        changed
    }

    /// The store answered (logged when it had not).
    pub fn store_ok(&self) {
        if self.set(&self.store, true) {
            tracing::info!("the rate-limit store answers: health passes");
        }
    }

    /// The store failed (logged when it had answered). Only a store without
    /// a fallback reports failures, so calls fail too.
    pub fn store_failed(&self) {
        if self.set(&self.store, false) {
            tracing::warn!(
                "the rate-limit store does not answer: health fails and calls are \
                 answered UNAVAILABLE until it does"
            );
        }
    }

    /// A configuration was loaded: with `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`,
    /// healthy iff it has a domain (upstream's `IsEmptyDomains`).
    pub fn config_loaded(&self, has_domains: bool) {
        if self.need_config {
            self.set(&self.config, has_domains);
        }
    }

    /// SIGTERM: unhealthy from now on.
    pub fn stopping(&self) {
        self.set(&self.stopping, true);
    }

    /// Sets the gRPC health service `ratelimit` to the state now: called
    /// before the server accepts, so a client never finds it unregistered.
    pub async fn report(&self, reporter: &HealthReporter) {
        let status = if self.is_healthy() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status(SERVICE, status).await;
    }

    /// Keeps the gRPC health service `ratelimit` in step, until dropped.
    pub async fn drive(self: Arc<Self>, reporter: HealthReporter) {
        loop {
            let changed = self.changed.notified();
            self.report(&reporter).await;
            changed.await;
        }
    }
}
