//! The layer in front of tonic, with a real tonic client (and TLS).
//!
//! One test binary for the area (`cargo test --test grpc`); each module
//! is one file of tests, and the shared helpers are mounted once below.

#[cfg(feature = "grpc-tls")]
#[path = "../support/pki.rs"]
mod pki;

#[cfg(feature = "grpc")]
mod grpc;
#[cfg(feature = "grpc-tls")]
mod grpc_tls;
