//! The reference models, from the crate's public conformance suite
//! (feature `conformance`): one definition for the suite and these tests.

pub use tower_throttle::store::conformance::model::Model;
