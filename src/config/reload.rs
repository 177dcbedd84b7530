//! A layer whose rules can be replaced while the service runs.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use tower_layer::Layer;
use tower_service::Service;

use super::{ConfigError, LayerConfig};
use crate::layer::ThrottleLayer;
use crate::service::Throttle;
use crate::store::Store;

/// The running rules of a layer built from a [`LayerConfig`], replaceable
/// at run time: [`RuleTable::reload`] checks the new rules with the store,
/// then swaps them in atomically.
///
/// * A request that started on the old rules finishes on them (its
///   response future keeps them); the next request a service is made ready
///   for sees the new ones.
/// * A rule whose name and policy stay keeps its counters: counters live in
///   the store under `prefix:rule-name:key`, and a reload changes no store
///   state. A rule whose policy changes carries its state as
///   [`crate::resolve`] describes for a policy change.
/// * A reload the store refuses, or a file that does not parse, is an
///   error, and the running rules stay as they were.
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
}

/// One generation of the table's rules.
struct Built<St> {
    layer: ThrottleLayer<St>,
    config: Arc<LayerConfig>,
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
    /// A table running `config` over `store`, once the store has said it
    /// can run every rule.
    pub fn new(store: St, config: LayerConfig) -> Result<Self, ConfigError> {
        Self::new_named(store, config, "configuration")
    }

    fn new_named(store: St, config: LayerConfig, source: &str) -> Result<Self, ConfigError> {
        let store = Arc::new(store);
        let owner = Arc::new(());
        let layer = build(&store, &owner, &config, source)?;
        let built = Built {
            layer,
            config: Arc::new(config),
            generation: 0,
        };
        Ok(RuleTable {
            shared: Arc::new(TableShared {
                store,
                current: ArcSwap::from_pointee(built),
                owner,
            }),
        })
    }

    /// A table running the file at `path` (see [`LayerConfig::from_path`]).
    pub fn from_path(store: St, path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let config = LayerConfig::from_path(path)?;
        Self::new_named(store, config, &path.display().to_string())
    }

    /// Replaces the rules with `config`'s, once the store has said it can
    /// run them; on an error the running rules stay.
    pub fn reload(&self, config: LayerConfig) -> Result<(), ConfigError> {
        self.reload_named(config, "configuration")
    }

    /// [`RuleTable::reload`] from the file at `path`: a file that cannot
    /// be read or parsed leaves the running rules as they were.
    pub fn reload_from_path(&self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        let path = path.as_ref();
        let config = LayerConfig::from_path(path)?;
        self.reload_named(config, &path.display().to_string())
    }

    fn reload_named(&self, config: LayerConfig, source: &str) -> Result<(), ConfigError> {
        let shared = &self.shared;
        let layer = build(&shared.store, &shared.owner, &config, source)?;
        let config = Arc::new(config);
        // Concurrent reloads each get their own generation; the last swap
        // wins, and every service sees that the generation moved.
        shared.current.rcu(|old| Built {
            layer: layer.clone(),
            config: config.clone(),
            generation: old.generation + 1,
        });
        Ok(())
    }

    /// The configuration running now.
    pub fn config(&self) -> Arc<LayerConfig> {
        self.shared.current.load().config.clone()
    }

    /// How many reloads have succeeded.
    pub fn generation(&self) -> u64 {
        self.shared.current.load().generation
    }

    /// The tower layer: its services run whatever rules the table holds
    /// when they are made ready.
    pub fn layer(&self) -> ReloadLayer<St> {
        ReloadLayer {
            table: self.clone(),
        }
    }
}

fn build<St: Store>(
    store: &Arc<St>,
    owner: &Arc<()>,
    config: &LayerConfig,
    source: &str,
) -> Result<ThrottleLayer<St>, ConfigError> {
    let layer = config.layer_on(store.clone(), source, Some(owner.clone()))?;
    layer
        .claim_namespaces()
        .map_err(|e| config.rule_error(source, &e))?;
    Ok(layer)
}

/// The tower [`Layer`] of a [`RuleTable`].
pub struct ReloadLayer<St> {
    table: RuleTable<St>,
}

impl<St> Clone for ReloadLayer<St> {
    fn clone(&self) -> Self {
        ReloadLayer {
            table: self.table.clone(),
        }
    }
}

impl<St> fmt::Debug for ReloadLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadLayer")
            .field("table", &self.table)
            .finish()
    }
}

impl<S: Clone, St: Store> Layer<S> for ReloadLayer<St> {
    type Service = ReloadService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        let built = self.table.shared.current.load_full();
        ReloadService {
            current: built.layer.layer(inner.clone()),
            generation: built.generation,
            inner,
            table: self.table.clone(),
        }
    }
}

/// The service of a [`ReloadLayer`]: a [`Throttle`] over the table's
/// rules, rebuilt when it is made ready after a reload.
pub struct ReloadService<S, St> {
    inner: S,
    table: RuleTable<St>,
    current: Throttle<S, St>,
    generation: u64,
}

impl<S: Clone, St> Clone for ReloadService<S, St> {
    fn clone(&self) -> Self {
        ReloadService {
            inner: self.inner.clone(),
            table: self.table.clone(),
            current: self.current.clone(),
            generation: self.generation,
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for ReloadService<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadService")
            .field("inner", &self.inner)
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
            self.current = current.layer.layer(self.inner.clone());
            self.generation = current.generation;
        }
        self.current.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.current.call(request)
    }
}
