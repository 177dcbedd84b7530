//! Building a [`ThrottleLayer`]'s services: validating its rules with the
//! store, claiming its key namespaces and rendering what every response
//! shares.

use std::sync::Arc;

use super::ThrottleLayer;
use crate::check::LayerState;
use crate::info::RuleSummary;
use crate::rule::{Rule, RuleCfg, RuleError};
use crate::store::{RuleSpec, Store};

impl<St: Store> ThrottleLayer<St> {
    /// Asks the store whether it can run this layer's rules
    /// ([`Store::validate`]): each rule alone, then all of them as the one
    /// all-or-nothing check a request makes; and whether another live layer
    /// on the store already uses one of its key namespaces (`prefix:rule:`),
    /// which would share its counters. [`Layer::layer`](tower_layer::Layer::layer) panics with
    /// this error, so a store that cannot run a rule (a sliding log above
    /// Redis's cap, a policy outside a store's exact range, rules that cannot
    /// share a cluster slot, a lock-out on a store that cannot keep its
    /// strikes) stops the service from starting instead of failing every
    /// request. Call it first to handle the error yourself.
    pub fn validate(&self) -> Result<(), RuleError> {
        if let Some(clash) = self.namespace_clash() {
            return Err(clash);
        }
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
        if let Some(penalty) = &self.settings.lockout {
            // Strikes and locks live in the same store; the error names the
            // lock-out's own policy.
            penalty
                .validate(&*self.store)
                .map_err(|(policy, error)| RuleError {
                    rules: vec![Arc::from("lockout")],
                    policy: Some(Box::new(policy)),
                    error: Box::new(error),
                })?;
        }
        Ok(())
    }

    /// `prefix:rule-name:`, the start of every key of `limit`.
    pub(super) fn key_head(&self, limit: &Rule) -> Vec<u8> {
        let mut key_head = Vec::new();
        if let Some(prefix) = &self.prefix {
            key_head.extend_from_slice(prefix.as_bytes());
            key_head.push(b':');
        }
        key_head.extend_from_slice(limit.name.as_bytes());
        key_head.push(b':');
        key_head
    }

    /// Sets each rule's applied limit and window as gauges (feature
    /// `metrics`), labelled as the request counters: a resolver's
    /// per-request policies show in the near-limit counter's `limit` label.
    #[cfg(feature = "metrics")]
    fn describe_limits(&self) {
        let prefix: Arc<str> = self.prefix.clone().unwrap_or_else(|| "".into());
        for rule in &self.limits {
            let labels = [
                metrics::Label::new("prefix", prefix.to_string()),
                metrics::Label::new("rule", rule.name.to_string()),
            ];
            metrics::gauge!("tower_throttle_rule_limit", labels.iter())
                .set(rule.policy.limit() as f64);
            metrics::gauge!("tower_throttle_rule_window_seconds", labels.iter())
                .set(rule.policy.window().as_secs_f64());
        }
    }

    pub(super) fn shared(&self) -> Arc<LayerState<St>> {
        let rules = self
            .limits
            .iter()
            .map(|limit| {
                let key_head = self.key_head(limit);
                self.claim(&key_head);
                let cost = limit.cost.clone().unwrap_or_else(|| self.cost.clone());
                RuleCfg {
                    key_head: key_head.into(),
                    policy: limit.policy,
                    key: limit.key.clone().unwrap_or_else(|| self.key.clone()),
                    cost: match limit.actual {
                        Some(_) => cost.at_least_one(),
                        None => cost,
                    },
                    source: limit.source.clone(),
                    actual: limit.actual.clone(),
                }
            })
            .collect::<Box<[RuleCfg]>>();
        let metas: Box<[RuleSummary]> = self
            .limits
            .iter()
            .map(|l| RuleSummary {
                name: l.name.clone(),
                policy: l.policy,
                // A quota settled in bytes sent says so unless told otherwise.
                unit: l.quota_unit.or(match l.actual {
                    Some(crate::meter::ActualCost::ResponseBytes) => {
                        Some(crate::response::fields::QuotaUnit::ContentBytes)
                    }
                    _ => None,
                }),
                exhausted: Default::default(),
            })
            .collect();
        #[cfg(feature = "metrics")]
        self.describe_limits();
        let meta = Arc::new(crate::response::layer_meta(metas, &self.settings.fields));
        let mut settings = self.settings.clone();
        settings.settles_cost = rules.iter().any(|r| r.actual.is_some());
        Arc::new(LayerState {
            store: self.store.clone(),
            holds: Arc::new(crate::check::Holds::new(self.limits.len())),
            simple: settings.simple(&rules),
            spares_figures: !settings.counts_near_limit(),
            plain_denials: settings.simple(&rules)
                && matches!(settings.body, crate::response::BodyFormat::PlainText)
                && !rules[0].policy.is_concurrency(),
            rules,
            meta,
            settings,
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

    /// The error for the first key namespace of this layer that another
    /// live layer on the store holds, unless it shares on purpose.
    fn namespace_clash(&self) -> Option<RuleError> {
        if self.shared_namespace {
            return None;
        }
        let namespaces = self.store.namespaces()?;
        self.limits.iter().find_map(|limit| {
            let head = self.key_head(limit);
            namespaces
                .held_by_other(&head, &self.owner)
                .then(|| namespace_error(limit, &head))
        })
    }

    /// Claims every key namespace of the layer now, or none: a layer built
    /// from a file holds its names from the moment it is loaded, so a
    /// second file (or a reload) that would share them is refused like a
    /// bad file instead of panicking when its service is built.
    #[cfg(feature = "config")]
    pub(crate) fn claim_namespaces(&self) -> Result<(), RuleError> {
        if let Some(clash) = self.namespace_clash() {
            return Err(clash);
        }
        for limit in &self.limits {
            self.claim(&self.key_head(limit));
        }
        Ok(())
    }

    /// Claims a rule's namespace in the store.
    ///
    /// # Panics
    ///
    /// When another live layer holds it and this one does not share on
    /// purpose: a configuration error, found when the service is built
    /// ([`validate`](Self::validate) reports it first).
    fn claim(&self, namespace: &[u8]) {
        if self.shared_namespace {
            return;
        }
        let Some(namespaces) = self.store.namespaces() else {
            return;
        };
        assert!(
            namespaces.claim(namespace, &self.owner),
            "{}",
            namespace_message(namespace)
        );
    }
}

fn namespace_message(namespace: &[u8]) -> String {
    format!(
        "two rate-limit layers on one store use the key namespace {:?} and would share \
         its counters; give one its own `.prefix(\"...\")` or rule `.name(...)`, or call \
         `.share_counters()` on the layer that shares them on purpose",
        String::from_utf8_lossy(namespace)
    )
}

fn namespace_error(limit: &Rule, namespace: &[u8]) -> RuleError {
    RuleError {
        rules: vec![limit.name.clone()],
        policy: Some(Box::new(limit.policy)),
        error: Box::new(crate::store::StoreError::Config(namespace_message(
            namespace,
        ))),
    }
}
