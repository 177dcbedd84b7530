//! Which layer uses which key namespace of a store, so that two layers do
//! not share counters by accident.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The key namespaces (`prefix:rule-name:`) the live layers of one store
/// use. Clones share one registry, as clones of a store share its counters.
///
/// A store that returns one from [`Store::namespaces`](super::Store::namespaces)
/// makes a second layer with a namespace a live layer already holds panic
/// when it is built (`Layer::layer`), instead of silently sharing counters
/// (a user's posts consuming their replies' quota). The check is per store
/// instance, so it is the same on every instance of an application; layers
/// on one Redis server through separate store instances are not seen.
#[derive(Clone, Default)]
pub struct Namespaces(Arc<Mutex<Owners>>);

/// Namespace → the layer holding it (dead once that layer is dropped).
type Owners = HashMap<Box<[u8]>, Weak<()>>;

impl fmt::Debug for Namespaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespaces").finish_non_exhaustive()
    }
}

impl Namespaces {
    /// Whether a live owner other than `owner` uses `namespace`.
    pub(crate) fn held_by_other(&self, namespace: &[u8], owner: &Arc<()>) -> bool {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let held = map.get(namespace).and_then(Weak::upgrade);
        held.is_some_and(|held| !Arc::ptr_eq(&held, owner))
    }

    /// Records that `owner` uses `namespace`; returns `false` when another
    /// live owner already does. An owner is dropped with its last layer
    /// and service, freeing its namespaces.
    pub(crate) fn claim(&self, namespace: &[u8], owner: &Arc<()>) -> bool {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = map.get(namespace).and_then(Weak::upgrade) {
            if !Arc::ptr_eq(&held, owner) {
                return false;
            }
            return true;
        }
        // Forget the namespaces of dropped layers while here: the map stays
        // bounded by the live layers.
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(namespace.into(), Arc::downgrade(owner));
        true
    }
}
