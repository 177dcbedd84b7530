//! The fields of a layer's plain-text 429, built once: a template with
//! placeholders where a response's own values go, and, for the common
//! denial, the complete fields by `Retry-After` seconds.

use std::sync::OnceLock;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue};

use super::{
    int_value, CACHED, RATELIMIT, RATELIMIT_POLICY, TEXT_PLAIN, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};

/// The fields of a layer's plain-text 429.
pub(crate) struct LimitedFields {
    /// Every field, with placeholder values.
    pub(crate) template: HeaderMap,
    /// Per rule, the common denial's complete fields by `Retry-After`
    /// seconds below [`CACHED`], each built on its first use (a table of
    /// empty cells is made on the rule's first denial): at most 128 small
    /// maps per rule, freed with the layer.
    common: Box<[OnceLock<BySecs>]>,
}

/// One rule's complete fields by seconds (`None`: not cacheable).
type BySecs = Box<[OnceLock<Option<HeaderMap>>]>;

impl LimitedFields {
    /// The fields of a layer with `rules` rules, `policy_header` its
    /// `RateLimit-Policy`, and the IETF and legacy fields on or off.
    pub(crate) fn new(
        rules: usize,
        policy_header: Option<&HeaderValue>,
        ietf: bool,
        legacy: bool,
    ) -> Self {
        let placeholder = HeaderValue::from_static("0");
        let mut template = HeaderMap::with_capacity(7);
        template.insert(CONTENT_TYPE, TEXT_PLAIN);
        template.insert(RETRY_AFTER, placeholder.clone());
        if ietf {
            if let Some(policy) = policy_header {
                template.insert(RATELIMIT_POLICY, policy.clone());
            }
            template.insert(RATELIMIT, placeholder.clone());
        }
        if legacy {
            for name in [X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET] {
                template.insert(name, placeholder.clone());
            }
        }
        LimitedFields {
            template,
            common: (0..rules).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The complete fields of `rule`'s common denial that retries in
    /// `secs`, if cached; `ratelimit` makes its `RateLimit` field.
    pub(crate) fn common(
        &self,
        rule: usize,
        secs: u64,
        ratelimit: impl FnOnce() -> Option<HeaderValue>,
    ) -> Option<&HeaderMap> {
        let i = usize::try_from(secs)
            .ok()
            .filter(|&s| s < CACHED as usize)?;
        let table = self
            .common
            .get(rule)?
            .get_or_init(|| (0..CACHED).map(|_| OnceLock::new()).collect());
        table[i]
            .get_or_init(|| {
                let mut headers = self.template.clone();
                headers.insert(RETRY_AFTER, int_value(secs));
                if headers.contains_key(RATELIMIT) {
                    headers.insert(RATELIMIT, ratelimit()?);
                }
                Some(headers)
            })
            .as_ref()
    }
}
