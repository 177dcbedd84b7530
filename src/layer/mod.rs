//! The middleware layer and its builder; the builder methods are grouped
//! by concern in the submodules.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use crate::key::{KeyExtractor, PeerIp};
use crate::policy::Policy;
use crate::rule::{Cost, Rule};
use crate::service::Throttle;
use crate::settings::Settings;
use crate::store::Store;

/// Rate-limits HTTP requests: applies one or more [`Rule`]s through a
/// [`Store`], answering `429 Too Many Requests` (or waiting, or only logging;
/// see [`Mode`](crate::Mode)) when one denies.
///
/// Works with `tower::ServiceBuilder`, axum's `Router::layer` and
/// `route_layer`, and any `Service<http::Request<B>>` whose response body's
/// data is built from [`Bytes`](bytes::Bytes) (axum, hyper). Clones share the store.
///
/// Every rule's key is `prefix:rule-name:key-part` (no `prefix:` unless set):
/// give each route's layer its own [`prefix`](Self::prefix) so routes do not
/// share counters. Two distinct
/// layers on one memory or Redis store with a rule of the same
/// `prefix:rule-name` would share that rule's counters: building the second
/// one panics, naming the namespace, unless it opts in with
/// [`share_counters`](Self::share_counters). Clones of a layer are the same
/// layer (one limit over every route it is applied to); changing a clone's
/// names, prefix or key makes it a new one.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::post, Router};
/// use http::StatusCode;
/// use tower_throttle::mode::OnMissingKey;
/// use tower_throttle::{key::FromExtension, MemoryStore, Policy, Rule, ThrottleLayer};
///
/// #[derive(Clone)]
/// struct UserId(u64);
/// impl std::fmt::Display for UserId {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
/// }
///
/// let store = MemoryStore::new();
/// // 5 replies a minute AND 100 a day per signed-in user, all or nothing.
/// let replies = ThrottleLayer::new(store.clone(), Policy::sliding_log(5, Duration::from_secs(60))?)
///     .name("minute")
///     .and(Rule::new("day", Policy::fixed_window(100, Duration::from_secs(86_400))?))
///     .key(FromExtension::<UserId>::new())
///     .prefix("reply")
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED));
/// let app: Router = Router::new().route("/reply", post(|| async { "ok" }).route_layer(replies));
/// # let _ = app;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[must_use = "builders do nothing until used"]
pub struct ThrottleLayer<St> {
    store: Arc<St>,
    limits: Vec<Rule>,
    key: Arc<dyn KeyExtractor>,
    cost: Cost,
    prefix: Option<Arc<str>>,
    // Crate-visible for the builder methods in `grpc::layer`.
    pub(crate) settings: Settings,
    /// Identifies this layer (and its clones) in the store's namespaces.
    owner: Arc<()>,
    /// Shares counters with other layers on purpose.
    shared_namespace: bool,
}

impl<St> Clone for ThrottleLayer<St> {
    fn clone(&self) -> Self {
        ThrottleLayer {
            store: self.store.clone(),
            limits: self.limits.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            prefix: self.prefix.clone(),
            settings: self.settings.clone(),
            owner: self.owner.clone(),
            shared_namespace: self.shared_namespace,
        }
    }
}

impl<St> fmt::Debug for ThrottleLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("limits", &self.limits)
            .field("prefix", &self.prefix)
            .field("mode", &self.settings.mode)
            .field("fail", &self.settings.fail)
            .finish_non_exhaustive()
    }
}

mod behaviour;
mod build;
mod inspect;
mod responses;
mod rules;

impl<St: Store> ThrottleLayer<St> {
    /// One rule, named `default`, applying `policy` per client address
    /// ([`PeerIp`]) at a cost of 1. Change the key with [`Self::key`].
    pub fn new(store: St, policy: Policy) -> Self {
        Self::from_first_rule(Arc::new(store), Rule::new("default", policy))
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.store
    }

    /// A layer of `rule` alone over a store already shared, keyed per
    /// client address until told otherwise.
    pub(crate) fn from_first_rule(store: Arc<St>, rule: Rule) -> Self {
        ThrottleLayer {
            store,
            limits: vec![rule],
            key: Arc::new(PeerIp::new()),
            cost: Cost::Fixed(1),
            prefix: None,
            settings: Settings::default(),
            owner: Arc::new(()),
            shared_namespace: false,
        }
    }

    /// The same layer, claiming its key namespaces as `owner` (the layers
    /// of one reloadable table take over each other's names).
    #[cfg(feature = "config")]
    pub(crate) fn owned_by(mut self, owner: Arc<()>) -> Self {
        self.owner = owner;
        self
    }
}

impl<S, St: Store> Layer<S> for ThrottleLayer<St> {
    type Service = Throttle<S, St>;

    /// # Panics
    ///
    /// When the store cannot run the rules ([`ThrottleLayer::validate`]): a
    /// configuration error, reported when the service is built rather than
    /// as a 503 on every request.
    fn layer(&self, inner: S) -> Self::Service {
        if let Err(e) = self.validate() {
            panic!("{e}");
        }
        Throttle::new(inner, self.shared())
    }
}
