//! A layer whose rules can be replaced while the service runs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tower_layer::Layer;
use tower_service::Service;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::{ConfigError, Extractors, ServiceConfig};
use crate::layer::ThrottleLayer;
use crate::service::Throttle;
use crate::store::Store;

/// The running limits of a service built from a [`ServiceConfig`] (one
/// layer, or several routes), replaceable at run time:
/// [`RuleTable::reload`] checks the new file as a start would (every route
/// with the store, the routes against each other and against every other
/// table on the store), then swaps all routes in at once.
///
/// * A request that started on the old rules finishes on them (its
///   response future keeps them); the next request a service is made ready
///   for sees the new ones.
/// * A rule whose name and policy stay keeps its counters: counters live in
///   the store under `prefix:rule-name:key`, and a reload changes no store
///   state. A rule whose policy changes carries its state as
///   [`crate::resolve`] describes for a policy change.
/// * A reload the store refuses, a file that does not parse, or one that
///   drops a route the service uses is an error, and the running limits
///   stay as they were.
///
/// Clones share the table.
pub struct RuleTable<St> {
    shared: Arc<TableShared<St>>,
}

struct TableShared<St> {
    store: Arc<St>,
    current: ArcSwap<Built<St>>,
    /// Every layer of the table claims its key namespaces as this owner,
    /// so a reload may keep (or take over) the names of the rules it
    /// replaces while any other layer on the store still may not.
    owner: Arc<()>,
    /// The routes handed out as layers: a reload must keep each. Held
    /// across a reload's check and swap.
    in_use: Mutex<BTreeSet<String>>,
    /// The key extractors files may name, for every load.
    extractors: Extractors,
}

/// One generation of the table's routes.
struct Built<St> {
    layers: BTreeMap<String, ThrottleLayer<St>>,
    config: Arc<ServiceConfig>,
    generation: u64,
}

impl<St> Clone for RuleTable<St> {
    fn clone(&self) -> Self {
        RuleTable {
            shared: self.shared.clone(),
        }
    }
}

impl<St> fmt::Debug for RuleTable<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let current = self.shared.current.load();
        f.debug_struct("RuleTable")
            .field("generation", &current.generation)
            .field("config", &current.config)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RuleTable<St> {
    /// A table running `config` (a [`ServiceConfig`], or one
    /// [`LayerConfig`](super::LayerConfig): the route
    /// [`DEFAULT_ROUTE`](super::DEFAULT_ROUTE)) over `store`, once the store
    /// has said it can run every rule of every route.
    pub fn new(store: St, config: impl Into<ServiceConfig>) -> Result<Self, ConfigError> {
        Self::with_extractors(store, config, Extractors::new())
    }

    /// [`RuleTable::new`], with the key extractors files may name
    /// (`key: { extractor: user_id }`), for this load and every reload.
    pub fn with_extractors(
        store: St,
        config: impl Into<ServiceConfig>,
        extractors: Extractors,
    ) -> Result<Self, ConfigError> {
        Self::new_named(store, config.into(), "configuration", extractors)
    }

    fn new_named(
        store: St,
        config: ServiceConfig,
        source: &str,
        extractors: Extractors,
    ) -> Result<Self, ConfigError> {
        let store = Arc::new(store);
        let owner = Arc::new(());
        let layers = build(&store, &owner, &config, source, &extractors)?;
        let built = Built {
            layers,
            config: Arc::new(config),
            generation: 0,
        };
        Ok(RuleTable {
            shared: Arc::new(TableShared {
                store,
                current: ArcSwap::from_pointee(built),
                owner,
                in_use: Mutex::default(),
                extractors,
            }),
        })
    }

    /// A table running the file at `path` (see [`ServiceConfig::from_path`]).
    pub fn from_path(store: St, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::from_path_with(store, path, Extractors::new())
    }

    /// [`RuleTable::from_path`], with the key extractors files may name.
    pub fn from_path_with(
        store: St,
        path: impl AsRef<Path>,
        extractors: Extractors,
    ) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let config = ServiceConfig::from_path(path)?;
        Self::new_named(store, config, &path.display().to_string(), extractors)
    }

    /// Replaces every route with `config`'s, once it passes every check a
    /// start makes and keeps every route in use; on an error the running
    /// limits stay.
    pub fn reload(&self, config: impl Into<ServiceConfig>) -> Result<(), ConfigError> {
        self.reload_named(config.into(), "configuration")
    }

    /// [`RuleTable::reload`] from the file at `path`: a file that cannot
    /// be read or parsed leaves the running limits as they were.
    pub fn reload_from_path(&self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        let path = path.as_ref();
        let config = ServiceConfig::from_path(path)?;
        self.reload_named(config, &path.display().to_string())
    }

    fn reload_named(&self, config: ServiceConfig, source: &str) -> Result<(), ConfigError> {
        let shared = &self.shared;
        let in_use = lock(&shared.in_use);
        if let Some(gone) = in_use.iter().find(|route| config.route(route).is_none()) {
            let message = format!(
                "the route `{gone}` serves requests and this file has no such route; \
                 keep it (a route is removed by a deploy that stops using it)"
            );
            return Err(ConfigError::new(source, message).at_field(config.field_of(gone, None)));
        }
        let layers = build(
            &shared.store,
            &shared.owner,
            &config,
            source,
            &shared.extractors,
        )?;
        let config = Arc::new(config);
        // Reloads are serialised by `in_use`; every service sees that the
        // generation moved.
        shared.current.rcu(|old| Built {
            layers: layers.clone(),
            config: config.clone(),
            generation: old.generation + 1,
        });
        Ok(())
    }

    /// The configuration running now.
    pub fn config(&self) -> Arc<ServiceConfig> {
        self.shared.current.load().config.clone()
    }

    /// How many reloads have succeeded.
    pub fn generation(&self) -> u64 {
        self.shared.current.load().generation
    }

    /// The tower layer of `route` (a file of one layer is the route
    /// [`DEFAULT_ROUTE`](super::DEFAULT_ROUTE)): its services run whatever
    /// rules the table holds for the route when they are made ready. An
    /// unknown route is an error now, before any traffic; from then on a
    /// reload that drops the route is refused.
    pub fn layer(&self, route: &str) -> Result<ReloadLayer<St>, ConfigError> {
        let mut in_use = lock(&self.shared.in_use);
        let current = self.shared.current.load();
        if !current.layers.contains_key(route) {
            let routes: Vec<&str> = current.layers.keys().map(String::as_str).collect();
            let message = format!("no route `{route}`; the file has {}", routes.join(", "));
            return Err(ConfigError::new("configuration", message));
        }
        in_use.insert(route.to_owned());
        Ok(ReloadLayer {
            table: self.clone(),
            route: route.into(),
        })
    }

    /// The layer `route` runs now (for [`ThrottleLayer::peek`] and
    /// [`ThrottleLayer::reset`] on its keys), if the table has that route.
    pub fn current(&self, route: &str) -> Option<ThrottleLayer<St>> {
        self.shared.current.load().layers.get(route).cloned()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every route's layer, checked as a start checks them: each with the
/// store, and each route's key namespaces claimed against every other
/// table on the store.
fn build<St: Store>(
    store: &Arc<St>,
    owner: &Arc<()>,
    config: &ServiceConfig,
    source: &str,
    extractors: &Extractors,
) -> Result<BTreeMap<String, ThrottleLayer<St>>, ConfigError> {
    let in_route = |route: &str, e: ConfigError| {
        let field = config.field_of(route, e.field.as_deref());
        ConfigError {
            field: Some(field),
            ..e
        }
    };
    let mut layers = BTreeMap::new();
    for (route, layer_config) in config.routes() {
        let layer = layer_config
            .layer_on(store.clone(), source, Some(owner.clone()), extractors)
            .map_err(|e| in_route(route, e))?;
        layers.insert(route.to_owned(), layer);
    }
    // Claimed once every route passed, so a refused file claims nothing.
    for (route, layer) in &layers {
        let layer_config = config.route(route).expect("built from the config");
        layer
            .claim_namespaces()
            .map_err(|e| in_route(route, layer_config.rule_error(source, &e)))?;
    }
    Ok(layers)
}

/// The tower [`Layer`] of a [`RuleTable`].
pub struct ReloadLayer<St> {
    table: RuleTable<St>,
    route: Arc<str>,
}

impl<St> Clone for ReloadLayer<St> {
    fn clone(&self) -> Self {
        ReloadLayer {
            table: self.table.clone(),
            route: self.route.clone(),
        }
    }
}

impl<St> fmt::Debug for ReloadLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadLayer")
            .field("route", &self.route)
            .field("table", &self.table)
            .finish()
    }
}

impl<S: Clone, St: Store> Layer<S> for ReloadLayer<St> {
    type Service = ReloadService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        let built = self.table.shared.current.load_full();
        // Present: a reload that drops a route in use is refused.
        let layer = &built.layers[&*self.route];
        ReloadService {
            current: layer.layer(inner.clone()),
            generation: built.generation,
            inner,
            table: self.table.clone(),
            route: self.route.clone(),
        }
    }
}

/// The service of a [`ReloadLayer`]: a [`Throttle`] over the table's
/// rules, rebuilt when it is made ready after a reload.
pub struct ReloadService<S, St> {
    inner: S,
    table: RuleTable<St>,
    route: Arc<str>,
    current: Throttle<S, St>,
    generation: u64,
}

impl<S: Clone, St> Clone for ReloadService<S, St> {
    fn clone(&self) -> Self {
        ReloadService {
            inner: self.inner.clone(),
            table: self.table.clone(),
            route: self.route.clone(),
            current: self.current.clone(),
            generation: self.generation,
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for ReloadService<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadService")
            .field("inner", &self.inner)
            .field("route", &self.route)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl<S, St, R> Service<R> for ReloadService<S, St>
where
    S: Clone,
    St: Store,
    Throttle<S, St>: Service<R>,
{
    type Response = <Throttle<S, St> as Service<R>>::Response;
    type Error = <Throttle<S, St> as Service<R>>::Error;
    type Future = <Throttle<S, St> as Service<R>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Swap only here: `call` must go to the service made ready.
        let current = self.table.shared.current.load();
        if current.generation != self.generation {
            if let Some(layer) = current.layers.get(&*self.route) {
                self.current = layer.layer(self.inner.clone());
            }
            self.generation = current.generation;
        }
        self.current.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.current.call(request)
    }
}
