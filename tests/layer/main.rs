//! The tower layer over HTTP: keys, rules, modes, statuses, lock-outs, `count_if`.
//!
//! One test binary for the area (`cargo test --test layer`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[path = "../support/capture.rs"]
mod capture;
#[path = "../support/counting_store.rs"]
mod counting_store;
#[cfg(feature = "redis")]
#[path = "../support/redis.rs"]
mod redis_support;
#[cfg(feature = "axum")]
#[path = "../support/served.rs"]
mod served;
#[path = "../support/tokio_clock.rs"]
mod tokio_clock;
#[path = "../support/warns.rs"]
mod warns;

#[cfg(feature = "axum")]
mod admin_example;
mod binding_rule;
mod concurrency_hold;
#[cfg(feature = "redis")]
mod config_errors;
#[cfg(feature = "config")]
mod config_fields;
#[cfg(feature = "config")]
mod config_file;
#[cfg(feature = "config")]
mod config_routes;
#[cfg(feature = "config")]
mod config_tables;
#[cfg(feature = "config")]
mod config_watch;
mod count_if;
mod delay_rules;
#[cfg(feature = "axum")]
mod fields;
mod hostile_input;
#[cfg(feature = "redis")]
mod hottest_layer;
#[cfg(feature = "axum")]
mod http_layer;
mod inspect;
mod inspect_identity;
mod layer_service;
#[cfg(feature = "redis")]
mod lockout_layer;
#[cfg(feature = "redis")]
mod lockout_seams;
mod metered;
#[cfg(feature = "axum")]
mod no_peer_address;
#[cfg(feature = "axum")]
mod not_limited;
mod per_request;
mod plain_denials;
#[cfg(feature = "redis")]
mod policy_change;
mod proxy_headers;
#[cfg(feature = "axum")]
mod stacked_fields;
#[cfg(feature = "axum")]
mod statuses;
mod transition_addresses;
#[cfg(feature = "axum")]
mod websocket_upgrade;
