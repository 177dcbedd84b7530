//! A limits file for a whole service: named routes, each a layer, loaded
//! and checked together.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer};

use super::{read, ConfigError, Format, LayerConfig};
use crate::limiter::valid_name;

/// The route a file without `routes:` (one layer) is: see
/// [`RuleTable::layer`](super::RuleTable::layer).
pub const DEFAULT_ROUTE: &str = "default";

/// Every layer of a service, by route name: what one limits file says.
///
/// A file is either one layer (`rules:` at the top, the route
/// [`DEFAULT_ROUTE`]) or several routes, each a layer:
///
/// ```yaml
/// routes:
///   reply:                       # keys `reply:<rule>:<key>`
///     key: { extractor: user_id }
///     rules:
///       - name: per-minute
///         policy: { sliding_log: { limit: 5, window: 60s } }
///   post:
///     prefix: posts              # instead of the route's name
///     rules:
///       - name: per-hour
///         policy: { cell: { max_burst: 2, count: 3, period: 1h } }
/// ```
///
/// A route without a `prefix` takes its name as its prefix, so two routes
/// never share counters unless a file says so (and then it is refused:
/// two routes with one `prefix:rule` namespace are an error naming both).
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    routes: BTreeMap<String, LayerConfig>,
    /// One layer, not `routes:`: errors name its fields as they are.
    single: bool,
}

impl ServiceConfig {
    /// Reads and checks the file at `path`, in the format its extension
    /// names (`.yaml`/`.yml`, `.toml`, `.json`).
    pub fn from_path(path: impl AsRef<Path>) -> Result<ServiceConfig, ConfigError> {
        let path = path.as_ref();
        let (source, text, format) = super::read_file(path)?;
        Self::parse_as(&source, &text, format)
    }

    /// Checks YAML text (JSON is YAML too); `source` names it in errors.
    pub fn parse(source: &str, text: &str) -> Result<ServiceConfig, ConfigError> {
        Self::parse_as(source, text, Format::Yaml)
    }

    /// Checks text in `format`; `source` names it in errors.
    pub fn parse_as(
        source: &str,
        text: &str,
        format: Format,
    ) -> Result<ServiceConfig, ConfigError> {
        let routes = read::<Probe>(source, text, format).is_ok_and(|p| p.routes.is_some());
        if !routes {
            let layer: LayerConfig = read(source, text, format)?;
            return Ok(ServiceConfig::from(layer));
        }
        let spec: RoutesSpec = read(source, text, format)?;
        let mut routes = spec.routes;
        for (name, layer) in &mut routes {
            if layer.prefix.is_none() {
                layer.prefix = Some(name.clone());
            }
        }
        let config = ServiceConfig {
            routes,
            single: false,
        };
        config.check_namespaces(source)?;
        Ok(config)
    }

    /// The routes, by name.
    pub fn routes(&self) -> impl Iterator<Item = (&str, &LayerConfig)> {
        self.routes
            .iter()
            .map(|(name, layer)| (name.as_str(), layer))
    }

    /// One route's layer.
    pub fn route(&self, name: &str) -> Option<&LayerConfig> {
        self.routes.get(name)
    }

    /// The field path of `route`'s `field`, as errors name it.
    pub(super) fn field_of(&self, route: &str, field: Option<&str>) -> String {
        match (self.single, field) {
            (true, Some(field)) => field.to_owned(),
            (true, None) => ".".to_owned(),
            (false, Some(field)) => format!("routes.{route}.{field}"),
            (false, None) => format!("routes.{route}"),
        }
    }

    /// Two routes whose rules would share a key namespace (`prefix:rule:`)
    /// would share counters: refused, naming both.
    fn check_namespaces(&self, source: &str) -> Result<(), ConfigError> {
        let mut seen: BTreeMap<(Option<&str>, &str), (&str, usize)> = BTreeMap::new();
        for (route, layer) in &self.routes {
            for (i, rule) in layer.rules.iter().enumerate() {
                let namespace = (layer.prefix.as_deref(), rule.name.as_str());
                if let Some((other, j)) = seen.insert(namespace, (route, i)) {
                    let message = format!(
                        "the key namespace `{}:{}:` is also routes.{other}.rules[{j}]'s: two routes \
                         would share its counters; give one another `prefix` or rule name",
                        namespace.0.unwrap_or(""),
                        namespace.1
                    );
                    let field = self.field_of(route, Some(&format!("rules[{i}]")));
                    return Err(ConfigError::new(source, message).at_field(field));
                }
            }
        }
        Ok(())
    }
}

impl From<LayerConfig> for ServiceConfig {
    /// One layer: the route [`DEFAULT_ROUTE`].
    fn from(layer: LayerConfig) -> Self {
        ServiceConfig {
            routes: BTreeMap::from([(DEFAULT_ROUTE.to_owned(), layer)]),
            single: true,
        }
    }
}

/// Whether a file has `routes:` (anything else is read as one layer).
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    routes: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoutesSpec {
    #[serde(deserialize_with = "routes")]
    routes: BTreeMap<String, LayerConfig>,
}

fn routes<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, LayerConfig>, D::Error> {
    let routes = BTreeMap::<String, LayerConfig>::deserialize(d)?;
    if routes.is_empty() {
        return Err(D::Error::custom("a service needs at least one route"));
    }
    if let Some(bad) = routes.keys().find(|name| !valid_name(name)) {
        return Err(D::Error::custom(format_args!(
            "route name {bad:?} must be 1-64 of [A-Za-z0-9_.-]"
        )));
    }
    Ok(routes)
}
