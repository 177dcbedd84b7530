//! What a key has left, read without charging: a check of cost 0. Shared
//! through `#[path]`: `#[path = "../support/peek.rs"] mod peek;`.

use tower_throttle::store::{Charge, Store};
use tower_throttle::Policy;

/// The units `key` has left under `policy`, unchanged by the reading.
pub async fn remaining<S: Store>(store: &S, key: &[u8], policy: &Policy) -> u64 {
    store
        .check(Charge::new(key, policy, 0))
        .await
        .unwrap()
        .remaining
}
