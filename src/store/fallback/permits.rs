//! Fallback permits and decisions, translated: a decision of the fallback
//! is marked as its own, and a permit it grants gets an id of ours, so a
//! release or refund finds the store that granted it.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::PoisonError;

use super::FallbackShared;
use crate::decision::{DecidedBy, Decision, PermitId};
use crate::policy::Policy;
use crate::store::probe::nanos;

/// Ids handed out for permits the fallback granted: ours → the fallback's.
pub(super) struct FallbackPermits {
    pub(super) map: HashMap<PermitId, (PermitId, u64)>,
    base: u64,
    next: u64,
    prune_at: usize,
}

/// The fewest ids held before forgotten leases are pruned.
pub(super) const MIN_PRUNE_AT: usize = 1024;

impl FallbackPermits {
    /// An empty map, numbering from a random base.
    pub(super) fn new() -> Self {
        // A random base, as the Redis store's: our ids must not collide with
        // the primary's, which pass through unchanged.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        FallbackPermits {
            map: HashMap::new(),
            base: h.finish(),
            next: 0,
            prune_at: MIN_PRUNE_AT,
        }
    }
}

impl FallbackShared {
    /// Marks `d` as the fallback's, and gives its permit an id of ours.
    pub(super) fn adopt(&self, policy: &Policy, mut d: Decision) -> Decision {
        d.decided_by = DecidedBy::Fallback;
        if let Some(theirs) = d.permit {
            let now = self.clock.now_ns();
            let expires = now.saturating_add(nanos(policy.window()));
            let mut p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
            if p.map.len() >= p.prune_at {
                // Permits never released lapse with their lease: forget them.
                p.map.retain(|_, (_, exp)| *exp > now);
                p.prune_at = (p.map.len() * 2).max(MIN_PRUNE_AT);
            }
            let ours = PermitId(p.base.wrapping_add(p.next));
            p.next += 1;
            p.map.insert(ours, (theirs, expires));
            d.permit = Some(ours);
        }
        d
    }

    /// The fallback's own id of our permit `id`, left registered.
    pub(super) fn their_permit(&self, id: PermitId) -> Option<PermitId> {
        let p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        p.map.get(&id).map(|&(theirs, _)| theirs)
    }

    /// The fallback's own id of our permit `id`, forgotten.
    pub(super) fn take_permit(&self, id: PermitId) -> Option<PermitId> {
        let mut p = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        p.map.remove(&id).map(|(theirs, _)| theirs)
    }
}
