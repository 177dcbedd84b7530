//! `ShouldRateLimit`: upstream's `shouldRateLimitWorker` over the loaded
//! table and a crate store.

mod counting;
mod grpc;
mod request;
mod response;
mod wire;

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwapOption;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tower_throttle::clock::Clock;
use tower_throttle::store::{BoxStore, RuleSpec, Store as _};

pub use counting::{reset_secs, Counted};
pub use grpc::RateLimitGrpc;
pub use request::{Bounds, RequestError};
pub use wire::{
    RequestDecoder, ResponseEncoder, WireCodec, WireDescriptor, WireEntry, WireRequest,
};

use crate::config::{Algorithm, ConfigError, Limit, Table};
use crate::health::Health;
use crate::matching::{get_limit, Matched, Query};
use crate::metrics::{Metrics, Stat};
use counting::{Counter, Item};

/// What shapes answers besides the table.
#[derive(Clone, Debug)]
pub struct Options {
    /// `CACHE_KEY_PREFIX`.
    pub cache_key_prefix: String,
    /// `SHADOW_MODE`.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`.
    pub quota_mode: bool,
    /// All-or-nothing counting.
    pub all_or_nothing: bool,
    /// `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: f32,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`'s three header names.
    pub response_headers: Option<[String; 3]>,
    /// Bounds on a request.
    pub bounds: Bounds,
}

/// The rate-limit service: the table in force, the store, the clock.
pub struct RateLimiter {
    table: ArcSwapOption<Table>,
    last_error: Mutex<Option<String>>,
    store: BoxStore,
    clock: Arc<dyn Clock>,
    counter: Counter,
    options: Options,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// What a descriptor became before counting.
enum Plan {
    NoLimit,
    Unlimited,
    Count(Matched),
}

impl RateLimiter {
    /// A service over `store`, reading time from `clock` (the store's own
    /// clock, so windows agree).
    pub fn new(
        store: BoxStore,
        clock: Arc<dyn Clock>,
        options: Options,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> Self {
        RateLimiter {
            table: ArcSwapOption::empty(),
            last_error: Mutex::new(None),
            store,
            clock,
            // Seven valid windows of a valid limit: cannot fail.
            counter: Counter::new()
                .unwrap_or_else(|_| unreachable!("the counter policies are valid")),
            options,
            metrics,
            health,
        }
    }

    /// Whether the store can count every limit of `table` (Redis refuses a
    /// GCRA tolerance of 50 days or more, a sliding log above 10,000 a
    /// window): asked before a table is put in force, at start, on a reload
    /// and on an xDS update alike, so a limit the store refuses is a refused
    /// configuration, never an error on every request.
    pub fn check_table(&self, table: &Table) -> Result<(), ConfigError> {
        for limit in table.limits() {
            let Some(policy) = &limit.policy else {
                continue;
            };
            self.store
                .validate(&[RuleSpec::new(policy, b"")])
                .map_err(|e| ConfigError {
                    file: "configuration".into(),
                    line: None,
                    field: Some(limit.full_key.clone()),
                    message: format!("the store cannot count this limit: {e}"),
                })?;
        }
        Ok(())
    }

    /// Puts `table` in force (requests in flight finish on the old one)
    /// and clears the last load error.
    pub fn set_table(&self, table: Table) {
        self.health.config_loaded(!table.is_empty());
        self.table.store(Some(Arc::new(table)));
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        self.metrics.config_loaded(true);
    }

    /// Records a refused load: the table in force stays.
    pub fn set_error(&self, error: String) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(error);
        self.metrics.config_loaded(false);
    }

    /// `/rlconfig`: the limits in force, then the last load error if the
    /// last load failed.
    pub fn dump(&self) -> String {
        let table = self.table.load();
        let mut out = table.as_ref().map_or_else(String::new, |t| t.dump());
        if let Some(e) = &*self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            let kept = if table.is_some() {
                "previous configuration kept"
            } else {
                "no configuration loaded"
            };
            out.push_str(&format!("last configuration load failed, {kept}: {e}\n"));
        }
        out
    }

    /// The table in force, if one was ever loaded.
    pub fn table(&self) -> Option<Arc<Table>> {
        self.table.load_full()
    }

    /// Why the last load failed, if it did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The statistics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Answers one request: a generated `RateLimitRequest`, or a
    /// [`WireRequest`] whose strings may be any bytes (each counted as its
    /// bytes; text gives the same counter either way).
    pub async fn should_rate_limit(
        &self,
        req: impl Into<WireRequest>,
    ) -> Result<RateLimitResponse, RequestError> {
        let (domain, descriptors) = request::check(req.into(), self.options.bounds)?;
        let table = self.table.load_full().ok_or(RequestError::NoConfig)?;
        let mut plans = Vec::with_capacity(descriptors.len());
        for d in &descriptors {
            let q = Query {
                entries: &d.entries,
                override_limit: d.override_limit,
            };
            let matched =
                get_limit(&table, &domain, &q).map_err(|e| RequestError::BadOverrideUnit(e.0))?;
            plans.push(matched);
        }
        let plans = replace(plans);
        let now_ns = self.clock.now_ns();
        let now_s = now_ns / 1_000_000_000;
        let mut items = Vec::new();
        for (plan, d) in plans.iter().zip(&descriptors) {
            if let Plan::Count(m) = plan {
                self.metrics.add(&m.stats_key, Stat::TotalHits, d.hits);
                items.push(Item {
                    limit: &m.limit,
                    key: self.counter_key(&domain, d, m, now_s),
                    hits: d.hits,
                });
            }
        }
        let counted = if self.options.all_or_nothing {
            counting::count_all(&self.store, &items, now_s).await
        } else {
            counting::count_each(&self.store, &self.counter, &items, now_s).await
        };
        let counted = counted.map_err(|e| {
            tracing::error!(error = %e, "the rate-limit store could not decide");
            // Only an outage is the store's health; a defect is logged.
            if e.is_unavailable() {
                self.health.store_failed();
            }
            RequestError::StoreUnavailable
        })?;
        self.health.store_ok();
        let mut counted = counted.into_iter();
        let mut outcomes = Vec::with_capacity(plans.len());
        for (plan, d) in plans.iter().zip(&descriptors) {
            outcomes.push(match plan {
                Plan::NoLimit => response::Outcome::NoLimit,
                Plan::Unlimited => response::Outcome::Unlimited,
                Plan::Count(m) => {
                    let c = counted.next().unwrap_or(Counted {
                        over: true,
                        remaining: 0,
                        reset_secs: 0,
                        counts: None,
                    });
                    self.record(m, d.hits, &c);
                    response::Outcome::Counted(m.limit.clone(), c)
                }
            });
        }
        Ok(response::build(&outcomes, &self.options))
    }

    /// `CACHE_KEY_PREFIX + domain + "_" + (key "_" value "_")* + window
    /// start` (upstream's `GenerateCacheKey`); the extension algorithms end
    /// with their name instead, their state not being per window.
    ///
    /// Built from the request's bytes, so a value that is not UTF-8 has a
    /// counter of its own and one that is gives upstream's key.
    fn counter_key(
        &self,
        domain: &[u8],
        d: &request::Descriptor,
        m: &Matched,
        now_s: u64,
    ) -> Vec<u8> {
        let mut key = Vec::with_capacity(64);
        key.extend_from_slice(self.options.cache_key_prefix.as_bytes());
        key.extend_from_slice(domain);
        key.push(b'_');
        for (i, (k, v)) in d.entries.iter().enumerate() {
            key.extend_from_slice(k);
            key.push(b'_');
            let shared = m.share.get(i).and_then(Option::as_deref);
            key.extend_from_slice(shared.map_or(v.as_slice(), str::as_bytes));
            key.push(b'_');
        }
        match (m.limit.algorithm, m.limit.unit) {
            (Algorithm::FixedWindow, Some(unit)) => key.extend_from_slice(
                (now_s / unit.divider() * unit.divider())
                    .to_string()
                    .as_bytes(),
            ),
            (algorithm, _) => key.extend_from_slice(algorithm.name().as_bytes()),
        }
        key
    }

    /// Upstream's near/over/within/shadow statistics.
    fn record(&self, m: &Matched, hits: u64, c: &Counted) {
        let key = &m.stats_key;
        let shadow = m.limit.shadow_mode;
        let Some((before, after)) = c.counts else {
            let stat = if c.over {
                Stat::OverLimit
            } else {
                Stat::WithinLimit
            };
            self.metrics.add(key, stat, hits);
            if c.over && shadow {
                self.metrics.add(key, Stat::ShadowMode, hits);
            }
            return;
        };
        let limit = u64::from(m.limit.requests_per_unit);
        let near = (limit as f32 * self.options.near_limit_ratio).floor() as u64;
        if c.over {
            let over = if before >= limit {
                hits
            } else {
                after.saturating_sub(limit)
            };
            self.metrics.add(key, Stat::OverLimit, over);
            if before < limit {
                self.metrics
                    .add(key, Stat::NearLimit, limit - near.max(before));
            }
            if shadow {
                self.metrics.add(key, Stat::ShadowMode, over);
            }
        } else {
            if after > near {
                let n = if before >= near { hits } else { after - near };
                self.metrics.add(key, Stat::NearLimit, n);
            }
            self.metrics.add(key, Stat::WithinLimit, hits);
        }
    }
}

/// Upstream's `replaces`: a matched limit named in any matched limit's
/// `replaces` is dropped (no status, no count); unlimited limits answer
/// without counting.
fn replace(matched: Vec<Option<Matched>>) -> Vec<Plan> {
    let replacing: Vec<String> = matched
        .iter()
        .flatten()
        .flat_map(|m| m.limit.replaces.iter().cloned())
        .collect();
    matched
        .into_iter()
        .map(|m| match m {
            None => Plan::NoLimit,
            Some(m) if m.limit.unlimited => Plan::Unlimited,
            Some(m) if !m.limit.name.is_empty() && replacing.contains(&m.limit.name) => {
                Plan::NoLimit
            }
            Some(m) => Plan::Count(m),
        })
        .collect()
}

/// The limit a status reports.
pub(crate) fn current_limit(
    limit: &Limit,
) -> envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit {
    envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit {
        name: limit.name.clone(),
        requests_per_unit: limit.requests_per_unit,
        unit: limit.unit.map_or(0, |u| u.proto()),
    }
}
