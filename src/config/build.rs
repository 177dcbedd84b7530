//! A [`LayerConfig`] made into a [`ThrottleLayer`]: every field applied
//! through the builder, then the whole checked with the store.

use std::sync::Arc;

use super::spec::{FailConfig, ModeConfig, RuleConfig};
use super::{BodyConfig, ConfigError, Extractors, LayerConfig, OnMissingKeyConfig};
use crate::layer::ThrottleLayer;
use crate::mode::{FailMode, Mode, OnMissingKey};
use crate::rule::Rule;
use crate::store::Store;

impl LayerConfig {
    /// A [`ThrottleLayer`] over `store` as this file describes it, once the
    /// store has said it can run every rule ([`ThrottleLayer::validate`]).
    /// A file naming a registered extractor needs [`layer_with`](Self::layer_with).
    pub fn layer<St: Store>(&self, store: St) -> Result<ThrottleLayer<St>, ConfigError> {
        self.layer_with(store, &Extractors::new())
    }

    /// [`layer`](Self::layer), with the key extractors the file may name.
    pub fn layer_with<St: Store>(
        &self,
        store: St,
        extractors: &Extractors,
    ) -> Result<ThrottleLayer<St>, ConfigError> {
        self.layer_on(Arc::new(store), "configuration", None, extractors)
    }

    pub(crate) fn layer_on<St: Store>(
        &self,
        store: Arc<St>,
        source: &str,
        owner: Option<Arc<()>>,
        extractors: &Extractors,
    ) -> Result<ThrottleLayer<St>, ConfigError> {
        let error =
            |field: String, message: String| ConfigError::new(source, message).at_field(field);
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            rules.push(rule(r, extractors).map_err(|(f, m)| error(format!("rules[{i}].{f}"), m))?);
        }
        let mut rules = rules.into_iter();
        let first = rules.next().expect("a layer file has at least one rule");
        let mut layer = ThrottleLayer::from_first_rule(store, first);
        for rule in rules {
            layer = layer.and(rule);
        }
        if let Some(prefix) = &self.prefix {
            layer = layer.prefix(prefix);
        }
        if let Some(key) = &self.key {
            let key = key
                .extractor(extractors)
                .map_err(|m| error("key".into(), m))?;
            layer = layer.key(key);
        }
        // Counted only by the metrics the feature brings: refused, not ignored.
        #[cfg(not(feature = "metrics"))]
        if self.near_limit_ratio.is_some() {
            let message = "`near_limit_ratio` needs the crate's `metrics` feature".to_owned();
            return Err(error("near_limit_ratio".into(), message));
        }
        layer = self.behaviour(layer);
        if let Some(lockout) = &self.lockout {
            let penalty = lockout.penalty().map_err(|m| error("lockout".into(), m))?;
            layer = layer.lockout(penalty);
        }
        if let Some(owner) = owner {
            // Before validating: the namespaces this owner holds are its own.
            layer = layer.owned_by(owner);
        }
        layer.validate().map_err(|e| self.rule_error(source, &e))?;
        Ok(layer)
    }

    /// Modes, outcomes, skips and the answer's fields.
    fn behaviour<St: Store>(&self, mut layer: ThrottleLayer<St>) -> ThrottleLayer<St> {
        layer = layer.mode(match self.mode {
            ModeConfig::Reject => Mode::Reject,
            ModeConfig::DryRun => Mode::DryRun,
            ModeConfig::DelayUpTo(max_wait) => Mode::Delay { max_wait },
        });
        layer = layer.fail_mode(match self.on_store_failure {
            FailConfig::Closed => FailMode::Closed,
            FailConfig::Open => FailMode::Open,
        });
        if let Some(timeout) = self.store_timeout {
            layer = layer.store_timeout(timeout);
        }
        if let Some(skip) = &self.skip {
            layer = layer.skip_if(skip.skips());
        }
        if let Some(count_if) = &self.count_if {
            layer = layer.count_if_outcome(count_if.counts());
        }
        if let Some(on_missing) = self.on_missing_key {
            layer = layer.on_missing_key(match on_missing {
                OnMissingKeyConfig::Reject(status) => OnMissingKey::Reject(status),
                OnMissingKeyConfig::Skip => OnMissingKey::Skip,
            });
        }
        #[cfg(feature = "metrics")]
        if let Some(ratio) = self.near_limit_ratio {
            layer = layer.near_limit_ratio(ratio);
        }
        if let Some(on) = self.ietf_headers {
            layer = layer.ietf_headers(on);
        }
        if let Some(profile) = self.field_profile {
            layer = layer.field_profile(profile.profile());
        }
        layer = layer.legacy_headers(self.legacy_headers);
        if let Some(format) = self.legacy_reset_format {
            layer = layer.legacy_reset_format(format.format());
        }
        layer = match self.body {
            BodyConfig::PlainText => layer.plain_text_body(),
            BodyConfig::ProblemJson => layer.problem_json_body(),
        };
        if self.share_counters {
            layer = layer.share_counters();
        }
        layer
            .headers_on_allowed(self.headers_on_allowed)
            .request_info(self.request_info)
    }

    /// A rule the store refused, as an error naming the file and field.
    pub(crate) fn rule_error(&self, source: &str, e: &crate::rule::RuleError) -> ConfigError {
        let field = match e.rules.as_slice() {
            [one] => match self.rules.iter().position(|r| *r.name == **one) {
                Some(i) => format!("rules[{i}]"),
                None => one.to_string(),
            },
            _ => "rules".to_owned(),
        };
        ConfigError::new(source, e.to_string()).at_field(field)
    }
}

/// One rule as its fields say; an error names the field (under the rule).
fn rule(r: &RuleConfig, extractors: &Extractors) -> Result<Rule, (String, String)> {
    let mut rule = Rule::new(&r.name, r.policy.0);
    if let Some(key) = &r.key {
        rule = rule.key(
            key.extractor(extractors)
                .map_err(|m| ("key".to_owned(), m))?,
        );
    }
    if let Some(cost) = &r.cost {
        rule = match cost.cost_fn() {
            Some(f) => rule.cost_fn(f),
            None => rule.cost(match cost {
                super::CostConfig::Fixed(n) => *n,
                _ => 1,
            }),
        };
    }
    if let Some(settle) = &r.settle {
        rule = rule.settle_cost(settle.actual());
    }
    if let Some(unit) = r.quota_unit {
        rule = rule.quota_unit(unit.unit());
    }
    if let Some(tiers) = &r.tiers {
        let by = (tiers.by.extractor(extractors)).map_err(|m| ("tiers.by".to_owned(), m))?;
        rule = rule.policy_fn(tiers.policy_fn(by));
    }
    Ok(rule)
}
