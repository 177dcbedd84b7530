//! `throttle-rls`: an Envoy rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) on
//! tower-throttle's stores, and a drop-in for envoyproxy/ratelimit: the same
//! environment variables, the same YAML, the same answers, with GCRA and
//! sliding windows as opt-in extension keys. See the README's
//! "Envoy rate-limit service" section.
//!
//! The binary reads [`settings::Settings::from_env`] and calls
//! [`server::run`]; tests call [`server::start`] with a clock of their own.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod config;
pub mod health;
pub mod http;
pub mod logging;
pub mod matching;
pub mod metrics;
pub mod reload;
pub mod server;
pub mod service;
pub mod settings;
pub mod statsd;
pub mod tls;
pub mod xds;
