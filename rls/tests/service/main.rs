//! throttle-rls over real sockets: a tonic client through `envoy-types`,
//! HTTP, health, reload, metrics, the binary, a real redis-server, and the
//! foreign (Python grpcio + xds-protos) client.
//!
//! One test binary for the service (`cargo test -p tower-throttle-rls`).

mod support;

/// The crate's test PKI (`tests/support/pki.rs`): its `Pki` for Redis TLS,
/// its `CertDir` under this suite's own gRPC PKI (`tls_pki.rs`).
#[path = "../../../tests/support/pki.rs"]
#[allow(dead_code)]
mod shared_pki;

mod binary;
mod cluster;
mod connection_age;
mod envoy_gateway;
mod extension;
mod flood;
mod health;
mod hits;
mod http;
mod leases;
mod process;
mod python;
mod raw_bytes;
mod redis;
mod reload;
mod requests;
mod sample;
mod shared_counters;
mod startup;
mod stats;
mod tls;
mod tls_pki;
mod topologies;
mod upstream;
mod xds;
