//! throttle-rls over real sockets: a tonic client through `envoy-types`,
//! HTTP, health, reload, metrics, the binary, a real redis-server, and the
//! foreign (Python grpcio + xds-protos) client.
//!
//! One test binary for the service (`cargo test -p tower-throttle-rls`).

mod support;

mod binary;
mod cluster;
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
