//! The middleware layer and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use crate::check::LayerState;
use crate::info::{Meta, RuleSummary};
use crate::key::{KeyExtractor, PeerIp, RequestHead};
use crate::mode::{FailMode, Mode, OnMissingKey};
use crate::policy::Policy;
use crate::response::{BodyFormat, Rejection, ResetFormat};
use crate::rule::{valid_name, Cost, Limit, RuleCfg, RuleError};
use crate::service::Throttle;
use crate::settings::Settings;
use crate::store::{RuleSpec, Store};

/// Rate-limits HTTP requests: applies one or more [`Limit`]s through a
/// [`Store`], answering `429 Too Many Requests` (or waiting, or only logging;
/// see [`Mode`]) when one denies.
///
/// Works with `tower::ServiceBuilder`, axum's `Router::layer` and
/// `route_layer`, and any `Service<http::Request<B>>` whose response body's
/// data is built from [`Bytes`] (axum, hyper). Clones share the store.
///
/// Every rule's key is `prefix:rule-name:key-part` (no `prefix:` unless set):
/// give each route's layer its own [`prefix`](Self::prefix) so routes do not
/// share counters (like the `@EntryTimes` annotation's prefix). Two distinct
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
/// use tower_throttle::{key::FromExtension, Limit, MemoryStore, OnMissingKey, Policy, ThrottleLayer};
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
///     .and(Limit::new("day", Policy::fixed_window(100, Duration::from_secs(86_400))?))
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
    limits: Vec<Limit>,
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

impl<St: Store> ThrottleLayer<St> {
    /// One rule, named `default`, applying `policy` per client address
    /// ([`PeerIp`]) at a cost of 1. Change the key with [`Self::key`].
    pub fn new(store: St, policy: Policy) -> Self {
        ThrottleLayer {
            store: Arc::new(store),
            limits: vec![Limit::new("default", policy)],
            key: Arc::new(PeerIp::new()),
            cost: Cost::Fixed(1),
            prefix: None,
            settings: Settings::default(),
            owner: Arc::new(()),
            shared_namespace: false,
        }
    }

    /// Renames the first rule (the one given to [`Self::new`]).
    ///
    /// # Panics
    ///
    /// On a name [`Limit::new`] refuses or one another rule already has.
    pub fn name(mut self, name: &str) -> Self {
        let first = Limit {
            name: name.into(),
            ..self.limits.remove(0)
        };
        assert!(
            valid_name(name),
            "rate-limit rule name {name:?} must be 1-64 of [A-Za-z0-9_.-]"
        );
        self.push(first, 0)
    }

    /// Adds a rule; every rule must admit a request (checked in one store
    /// call, all or nothing), and a denial reports the longest wait.
    ///
    /// # Panics
    ///
    /// When another rule of the layer has the same name.
    pub fn and(self, limit: Limit) -> Self {
        let at = self.limits.len();
        self.push(limit, at)
    }

    fn push(mut self, limit: Limit, at: usize) -> Self {
        self.owner = Arc::new(());
        assert!(
            self.limits.iter().all(|l| l.name != limit.name),
            "two rate-limit rules of one layer are named {:?}",
            limit.name
        );
        self.limits.insert(at, limit);
        self
    }

    /// The key of every rule that has none of its own (default [`PeerIp`]).
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.owner = Arc::new(());
        self.key = Arc::new(key);
        self
    }

    /// The cost of a request for every rule without its own (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// The cost of a request, computed from it, for every rule without its own.
    pub fn cost_fn(mut self, f: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Cost::Fn(Arc::new(f));
        self
    }

    /// Takes the first rule's policy from the request (see
    /// [`Limit::policy_fn`]): `None` keeps the rule's own.
    pub fn policy_fn(
        mut self,
        f: impl Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        let first = self.limits.remove(0).policy_fn(f);
        self.limits.insert(0, first);
        self
    }

    /// Takes the first rule's policy from a `T` in the request extensions,
    /// set by an authentication layer (see [`Limit::policy_from_extension`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::FromExtension, MemoryStore, Policy, ThrottleLayer};
    ///
    /// #[derive(Clone)]
    /// enum Tier { Free, Premium }
    ///
    /// let premium = Policy::sliding_window(50, Duration::from_secs(60))?;
    /// let replies = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(5, Duration::from_secs(60))?)
    ///     .name("reply")
    ///     .policy_from_extension(move |tier: &Tier| match tier {
    ///         Tier::Premium => Some(premium),
    ///         Tier::Free => None, // the layer's own: 5 a minute
    ///     });
    /// # let _ = replies;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn policy_from_extension<T: Send + Sync + 'static>(
        mut self,
        f: impl Fn(&T) -> Option<Policy> + Send + Sync + 'static,
    ) -> Self {
        let first = self.limits.remove(0).policy_from_extension(f);
        self.limits.insert(0, first);
        self
    }

    /// Lets requests for which `skip` returns true through without any
    /// check, key or store call (health checks, internal networks).
    ///
    /// Security: decide only from what the client cannot forge. The peer
    /// address of a direct connection, a path, or a header your own trusted
    /// proxy sets (and strips from client requests) are fine; a header the
    /// client sends is not — anyone who learns `X-Internal: 1` bypasses the
    /// limit. Skipped requests get no rate-limit headers or
    /// [`RateLimitInfo`](crate::RateLimitInfo).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
    ///
    /// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(100, Duration::from_secs(60))?)
    ///     .skip_if(|req| req.uri().path() == "/healthz");
    /// # let _ = layer;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn skip_if(
        mut self,
        skip: impl Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.settings.skip = Some(Arc::new(skip));
        self
    }

    /// Counts only requests whose response status satisfies `counts`: the
    /// others are refunded once their response head is back. Failed logins
    /// only: `count_if(|s| s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN)`;
    /// refund server errors: `count_if(|s| !s.is_server_error())`. An inner
    /// service error counts as a 500.
    ///
    /// Exact by reservation: every admitted request is charged up front
    /// and refunded if it does not count, so the limit is never exceeded.
    /// Sequential requests see exactly the limit (with 5 failed logins per
    /// 15 minutes, the 6th failed attempt in a row is refused; successful
    /// ones leave no trace). Concurrent ones can only be refused early:
    /// while requests are in flight their charges are held, so a request
    /// may be refused because of in-flight requests that later turn out
    /// not to count (it may retry after them; `Retry-After` reflects the
    /// held charges). A request abandoned before its response keeps its
    /// charge: hanging up does not dodge the count. Concurrency rules
    /// release their permits as usual and are not refunded.
    pub fn count_if(mut self, counts: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.settings.count_if = Some(Arc::new(counts));
        self
    }

    /// Locks a rule's key out for a while after repeated denials (see
    /// [`Penalty`](crate::lockout::Penalty)): once a rule of this layer has
    /// refused a key `strikes` times within the penalty's window, every
    /// request of that key is answered `429` (gRPC: `RESOURCE_EXHAUSTED`)
    /// for the lock's duration, without being charged, with `Retry-After`
    /// (and the `RateLimit` reset) = the time left on the lock and nothing
    /// remaining. The denial that locks already answers with the lock's time.
    ///
    /// It applies to every rule of the layer, each rule key on its own
    /// (`<penalty prefix>:lock:<layer prefix>:<rule>:<key>`), and works on
    /// every store; on Redis it costs one more round trip per rule and
    /// request, and a denial one to three more. Counted are the requests the
    /// layer rejects: in delay mode a request that waits for its quota is no
    /// strike, and a locked key is refused at once; a dry run neither checks
    /// nor records lock-outs. Lock checks honour the
    /// [`store_timeout`](Self::store_timeout) and [`FailMode`]. Layers
    /// without a lock-out pay nothing for it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::{key::Global, lockout::Penalty, MemoryStore, Policy, ThrottleLayer};
    ///
    /// let min = Duration::from_secs(60);
    /// // 5 logins a minute; 3 refusals within 10 minutes lock the key for 5.
    /// let login = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, min)?)
    ///     .name("login")
    ///     .key(Global)
    ///     .lockout(Penalty::new(3, 10 * min, 5 * min)?);
    /// # let _ = login;
    /// # Ok::<(), tower_throttle::PolicyError>(())
    /// ```
    pub fn lockout(mut self, penalty: crate::lockout::Penalty) -> Self {
        self.settings.lockout = Some(Arc::new(penalty));
        self
    }

    /// Prepends `prefix:` to every key of this layer.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.owner = Arc::new(());
        self.prefix = Some(prefix.into());
        self
    }

    /// Lets this layer use the counters of another layer on the same store
    /// with the same `prefix:rule-name` (one budget over several routes or
    /// stacks, on purpose). Without it, building such a second layer panics.
    pub fn share_counters(mut self) -> Self {
        self.shared_namespace = true;
        self
    }

    /// What to do with a denied request (default [`Mode::Reject`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.settings.mode = mode;
        self
    }

    /// [`Mode::Delay`]: hold a denied request up to `max_wait` for its quota.
    pub fn delay_up_to(self, max_wait: Duration) -> Self {
        self.mode(Mode::Delay { max_wait })
    }

    /// [`Mode::DryRun`]: evaluate and report, never reject.
    pub fn dry_run(self) -> Self {
        self.mode(Mode::DryRun)
    }

    /// What to do when the store fails or times out (default [`FailMode::Closed`]).
    pub fn fail_mode(mut self, fail: FailMode) -> Self {
        self.settings.fail = fail;
        self
    }

    /// Forwards requests unlimited when the store fails.
    pub fn fail_open(self) -> Self {
        self.fail_mode(FailMode::Open)
    }

    /// Answers 503 when the store fails (the default).
    pub fn fail_closed(self) -> Self {
        self.fail_mode(FailMode::Closed)
    }

    /// Gives up on a store call after `timeout`, then applies the fail mode
    /// (default: no limit beyond the store's own). Needs a tokio runtime
    /// with time enabled.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = Some(timeout);
        self
    }

    /// What to do when a rule finds no key the client should have sent
    /// (default 401 with an explanation). A key the server cannot build (no
    /// peer address) is always a 500: see [`OnMissingKey`].
    pub fn on_missing_key(mut self, on_missing: OnMissingKey) -> Self {
        self.settings.on_missing = on_missing;
        self
    }

    /// Adds `RateLimit-Policy` / `RateLimit` (and the legacy headers if
    /// enabled) to admitted responses too (default: only to 429s, and in
    /// dry-run mode).
    pub fn headers_on_allowed(mut self, enabled: bool) -> Self {
        self.settings.headers_on_allowed = enabled;
        self
    }

    /// Inserts the [`RateLimitInfo`](crate::RateLimitInfo) of admitted
    /// requests into their extensions for handlers (default off: it costs
    /// two allocations per request, about a third of the layer's time on
    /// the in-process path). Turn it on when a handler reads it; in axum
    /// take `Option<Extension<RateLimitInfo>>` or a handler of a layer
    /// without it answers 500.
    pub fn request_info(mut self, enabled: bool) -> Self {
        self.settings.request_info = enabled;
        self
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ietf_headers(mut self, enabled: bool) -> Self {
        self.settings.ietf_headers = enabled;
        self
    }

    /// Sends `X-RateLimit-Limit`, `-Remaining` and `-Reset` (default off).
    pub fn legacy_headers(mut self, enabled: bool) -> Self {
        self.settings.legacy_headers = enabled;
        self
    }

    /// How `X-RateLimit-Reset` is written: seconds from now (the default)
    /// or a Unix timestamp. Either way it is the time until the key is fully
    /// fresh, where the IETF `t` is the time until more quota is available.
    pub fn legacy_reset_format(mut self, format: ResetFormat) -> Self {
        self.settings.legacy_reset = format;
        self
    }

    /// Rejection bodies as `text/plain` (the default).
    pub fn plain_text_body(mut self) -> Self {
        self.settings.body = BodyFormat::PlainText;
        self
    }

    /// Rejection bodies as RFC 9457 `application/problem+json`.
    pub fn problem_json_body(mut self) -> Self {
        self.settings.body = BodyFormat::ProblemJson;
        self
    }

    /// Builds every rejection response with `f`. The `Retry-After` and
    /// rate-limit headers are added to a 429 unless `f` set them.
    pub fn custom_response(
        mut self,
        f: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.settings.body = BodyFormat::Custom(Arc::new(f));
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<St> {
        &self.store
    }

    /// Asks the store whether it can run this layer's rules
    /// ([`Store::validate`]): each rule alone, then all of them as the one
    /// all-or-nothing check a request makes. [`Layer::layer`] panics with
    /// this error, so a store that cannot run a rule (a sliding log above
    /// Redis's cap, a policy outside a store's exact range, rules that cannot
    /// share a cluster slot) stops the service from starting instead of
    /// failing every request. Call it first to handle the error yourself.
    pub fn validate(&self) -> Result<(), RuleError> {
        let heads: Vec<Vec<u8>> = self.limits.iter().map(|l| self.key_head(l)).collect();
        let specs: Vec<RuleSpec<'_>> = self
            .limits
            .iter()
            .zip(&heads)
            .map(|(l, h)| RuleSpec::new(&l.policy, h))
            .collect();
        for (limit, spec) in self.limits.iter().zip(&specs) {
            self.store
                .validate(std::slice::from_ref(spec))
                .map_err(|error| RuleError {
                    rules: vec![limit.name.clone()],
                    policy: Some(Box::new(limit.policy)),
                    error: Box::new(error),
                })?;
        }
        if specs.len() > 1 {
            self.store.validate(&specs).map_err(|error| RuleError {
                rules: self.limits.iter().map(|l| l.name.clone()).collect(),
                policy: None,
                error: Box::new(error),
            })?;
        }
        Ok(())
    }

    /// `prefix:rule-name:`, the start of every key of `limit`.
    fn key_head(&self, limit: &Limit) -> Vec<u8> {
        let mut key_head = Vec::new();
        if let Some(prefix) = &self.prefix {
            key_head.extend_from_slice(prefix.as_bytes());
            key_head.push(b':');
        }
        key_head.extend_from_slice(limit.name.as_bytes());
        key_head.push(b':');
        key_head
    }

    fn shared(&self) -> Arc<LayerState<St>> {
        let rules = self
            .limits
            .iter()
            .map(|limit| {
                let key_head = self.key_head(limit);
                self.claim(&key_head);
                RuleCfg {
                    key_head: key_head.into(),
                    policy: limit.policy,
                    key: limit.key.clone().unwrap_or_else(|| self.key.clone()),
                    cost: limit.cost.clone().unwrap_or_else(|| self.cost.clone()),
                    source: limit.source.clone(),
                }
            })
            .collect::<Box<[RuleCfg]>>();
        let metas: Box<[RuleSummary]> = self
            .limits
            .iter()
            .map(|l| RuleSummary {
                name: l.name.clone(),
                policy: l.policy,
                exhausted: Default::default(),
            })
            .collect();
        let mut meta = Meta::new(
            metas,
            self.settings.ietf_headers,
            self.settings.legacy_headers,
        );
        meta.legacy_reset = self.settings.legacy_reset;
        let meta = Arc::new(meta);
        Arc::new(LayerState {
            store: self.store.clone(),
            holds: Arc::new(crate::check::Holds::new(self.limits.len())),
            simple: self.settings.simple(&rules),
            rules,
            meta,
            settings: self.settings.clone(),
            _owner: self.owner.clone(),
            #[cfg(feature = "metrics")]
            metric_prefix: self.prefix.clone().unwrap_or_else(|| "".into()),
            #[cfg(feature = "metrics")]
            metric_rules: self
                .limits
                .iter()
                .map(|l| &*l.name)
                .collect::<Vec<_>>()
                .join("+")
                .into(),
        })
    }

    /// Claims a rule's namespace in the store.
    ///
    /// # Panics
    ///
    /// When another live layer holds it and this one does not share on
    /// purpose: a configuration error, found when the service is built.
    fn claim(&self, namespace: &[u8]) {
        if self.shared_namespace {
            return;
        }
        let Some(namespaces) = self.store.namespaces() else {
            return;
        };
        assert!(
            namespaces.claim(namespace, &self.owner),
            "two rate-limit layers on one store use the key namespace {:?} and would share \
             its counters; give one its own `.prefix(\"...\")` or rule `.name(...)`, or call \
             `.share_counters()` on the layer that shares them on purpose",
            String::from_utf8_lossy(namespace)
        );
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
