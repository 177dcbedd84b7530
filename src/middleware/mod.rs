//! The middleware floor: the tower layer, service and response future, the
//! key extractors, one request's check, and the answers it renders (HTTP
//! 429/503/500 with the rate-limit fields, gRPC statuses). It builds on the
//! engine and nothing below depends on it.

pub(crate) mod body;
pub(crate) mod check;
pub(crate) mod fields;
pub mod future;
pub mod grpc;
pub(crate) mod info;
pub mod key;
pub(crate) mod layer;
pub(crate) mod mode;
pub(crate) mod outcome;
pub mod resolve;
pub mod response;
pub(crate) mod rule;
pub(crate) mod service;
pub(crate) mod settings;
pub(crate) mod upgrade;
