//! What the layer logs, and how often.
//!
//! One test binary for the area (`cargo test --test logged_once`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[cfg(feature = "axum")]
#[path = "../support/capture.rs"]
mod capture;

#[cfg(feature = "axum")]
mod logged_once;
