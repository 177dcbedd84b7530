//! The engine floor: what a limit is ([`policy`]), the pure algorithms
//! ([`algorithm`]), decisions, clocks, the stores that keep state, and the
//! direct API ([`limiter`], [`multi`], [`lockout`]). Nothing here knows HTTP,
//! tower or a request.

pub mod algorithm;
pub mod clock;
pub(crate) mod decision;
pub(crate) mod limiter;
pub mod lockout;
pub(crate) mod multi;
pub(crate) mod policy;
pub mod store;
