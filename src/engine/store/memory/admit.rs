//! The admission-only check: [`check_sync`](MemoryStore::check_sync) for a
//! caller that reads nothing of an allowed decision (the simple layer's
//! admitted path), so a GCRA admission computes no `remaining`,
//! `reset_after` or `quota_after`. Same state changes, same promotions;
//! denials come complete.

use super::hot::{self, admit_on, Brief, Lookup};
use super::slot::Slot;
use super::{read, MemoryStore};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::policy::{Algorithm, GcraParams};
use crate::store::{Charge, StoreError};

impl<C: Clock> MemoryStore<C> {
    /// Decides one rule now: `Ok(None)` for an admission that hands nothing
    /// back (no concurrency permit), whose figures are not computed;
    /// otherwise the complete decision [`check_sync`](Self::check_sync)
    /// gives.
    pub(super) fn admit_sync(&self, rule: Charge<'_>) -> Result<Option<Decision>, StoreError> {
        let Algorithm::Gcra(p) = rule.policy.algorithm() else {
            return self.check_sync(rule).map(Some);
        };
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(rule.key);
        let cost = rule.cost;
        let promote = match hot::check_with(self.inner.id, hash, |c| c.admit(p, now, cost)) {
            Lookup::Hit(brief) => return Ok(brief.decision()),
            Lookup::Miss { promote } => promote,
        };
        let found = read(self.shard(index))
            .slots
            .get(&hash)
            .and_then(|slot| slot.admit(p, now, cost));
        if let Some(brief) = found {
            // The read lock is released: promoting takes the write lock.
            if promote {
                self.promote(index, hash);
            }
            return Ok(brief.decision());
        }
        self.check_absent(rule, now, hash, index, None).map(Some)
    }
}

impl Brief {
    fn decision(self) -> Option<Decision> {
        match self {
            Brief::Admitted => None,
            Brief::Denied(d) => Some(d),
        }
    }
}

impl Slot {
    /// [`check`](Slot::check) for a GCRA policy, admission-only; `None` if
    /// the slot holds another algorithm's state.
    #[inline]
    fn admit(&self, p: &GcraParams, now: u64, cost: u64) -> Option<Brief> {
        match self {
            Slot::Gcra(tat, _) => admit_on(tat, p, now, cost),
            Slot::Hot(hot, _) => hot.0.admit(p, now, cost),
            Slot::Other(..) => None,
        }
    }
}
