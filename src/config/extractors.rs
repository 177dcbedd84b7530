//! Key extractors an application registers by name, so a file can key a
//! rule on what only code knows: a user id your authentication put in the
//! request's extensions, never a header a client could set.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::key::KeyExtractor;

/// Named key extractors for files: `key: { extractor: user_id }`.
///
/// ```
/// use tower_throttle::config::{Extractors, LayerConfig};
/// use tower_throttle::key::FromExtensionWith;
/// use tower_throttle::MemoryStore;
///
/// #[derive(Clone)]
/// struct UserId(u64); // set by your authentication layer
///
/// let extractors = Extractors::new()
///     .with("user_id", FromExtensionWith::new(|u: &UserId| u.0));
/// let config = LayerConfig::parse(
///     "limits.yaml",
///     "key: { extractor: user_id }\nrules: [{ name: reply, policy: { sliding_log: { limit: 5, window: 60s } } }]",
/// )?;
/// let layer = config.layer_with(MemoryStore::new(), &extractors)?;
/// # let _ = layer;
/// # Ok::<(), tower_throttle::config::ConfigError>(())
/// ```
///
/// A file naming an extractor that is not registered is refused when it is
/// loaded, naming the field.
#[derive(Clone, Default)]
#[must_use = "builders do nothing until used"]
pub struct Extractors(BTreeMap<String, Arc<dyn KeyExtractor>>);

impl Extractors {
    /// No extractors.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `extractor` as `name` (a later one of the same name replaces it).
    pub fn with(mut self, name: &str, extractor: impl KeyExtractor) -> Self {
        self.0.insert(name.to_owned(), Arc::new(extractor));
        self
    }

    pub(super) fn get(&self, name: &str) -> Result<Arc<dyn KeyExtractor>, String> {
        self.0.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.0.keys().map(String::as_str).collect();
            match known.as_slice() {
                [] => format!("no key extractor `{name}` is registered (none is)"),
                known => format!(
                    "no key extractor `{name}` is registered (registered: {})",
                    known.join(", ")
                ),
            }
        })
    }
}

impl fmt::Debug for Extractors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}
