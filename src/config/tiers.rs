//! Tiers: a policy per value of a key.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::key::KeyConfig;
use super::policy::PolicyConfig;
use crate::key::{KeyExtractor, KeyWriter, RequestHead};
use crate::policy::Policy;

/// A policy per value of a key: tiers ([`Rule::policy_fn`](crate::Rule::policy_fn)).
///
/// ```yaml
/// tiers:
///   by: { extractor: plan }      # or { header: x-plan }, ...
///   policies:
///     pro: { sliding_window: { limit: 50, window: 60s } }
///     team: { sliding_window: { limit: 500, window: 60s } }
/// ```
///
/// A request whose value is not listed (or that has none) gets the rule's
/// own policy. Take the value from something the client cannot choose (an
/// extension your authentication sets, through a registered extractor).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TiersConfig {
    /// The key whose value picks the tier.
    pub by: KeyConfig,
    /// The policy of each value.
    pub policies: BTreeMap<String, PolicyConfig>,
}

impl TiersConfig {
    pub(super) fn policy_fn(
        &self,
        by: Arc<dyn KeyExtractor>,
    ) -> impl Fn(&RequestHead<'_>) -> Option<Policy> + Send + Sync + 'static {
        let policies: BTreeMap<Vec<u8>, Policy> = (self.policies.iter())
            .map(|(value, p)| (value.as_bytes().to_vec(), p.0))
            .collect();
        move |req| {
            let mut value = Vec::new();
            by.extract(req, &mut KeyWriter::new(&mut value)).ok()?;
            policies.get(&value).copied()
        }
    }
}
