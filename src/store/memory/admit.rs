//! The admission-only check: [`check_sync`](MemoryStore::check_sync) for a
//! caller that reads nothing of an allowed decision (the simple layer's
//! admitted path), so a GCRA admission computes no `remaining`,
//! `reset_after` or `quota_after`. Same state changes, same promotions;
//! denials come complete.

use super::hot::{self, admit_on, Brief, Lookup};
use super::slot::Slot;
use super::{read, MemoryStore};
use crate::algorithm::gcra;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::policy::{Algorithm, GcraParams};
use crate::store::{Charge, StoreError};

/// What `Store::admit_now` answers.
pub(super) type Admitted = Option<Result<Option<Decision>, StoreError>>;

impl<C: Clock> MemoryStore<C> {
    /// Decides one rule now, as `Store::admit_now` answers (always
    /// `Some`: in process): `Ok(None)` for an admission that hands nothing
    /// back (no concurrency permit), whose figures are not computed;
    /// otherwise the complete decision [`check_sync`](Self::check_sync)
    /// gives. Every path builds the trait's own type where it returns, so
    /// no answer is copied from one wrapper into the next on the way out
    /// (a copy of the whole 112-byte enum, even for a bare admission).
    pub(super) fn admit_sync(&self, rule: Charge<'_>) -> Admitted {
        let Algorithm::Gcra(p) = rule.policy.algorithm() else {
            return Some(self.check_sync(rule).map(Some));
        };
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(rule.key);
        let cost = rule.cost;
        let promote = match hot::check_with(self.inner.id, hash, |c| c.admit(p, now, cost)) {
            Lookup::Hit(brief) => return Some(Ok(self.answer(&rule, brief, p, now))),
            Lookup::Miss { promote } => promote,
        };
        self.admit_in_map(rule, p, now, hash, index, promote)
    }

    /// [`admit_sync`](Self::admit_sync) of a key not on this thread's hot
    /// cell: through its shard. Apart, so the hot cell's path keeps a small
    /// frame.
    #[inline(never)]
    fn admit_in_map(
        &self,
        rule: Charge<'_>,
        p: &GcraParams,
        now: u64,
        hash: u64,
        index: usize,
        promote: bool,
    ) -> Admitted {
        let cost = rule.cost;
        let found = read(self.shard(index))
            .slots
            .get(&hash)
            .and_then(|slot| slot.admit(p, now, cost));
        if let Some(brief) = found {
            // The read lock is released: promoting takes the write lock.
            if promote {
                self.promote(index, hash);
            }
            return Some(Ok(self.answer(&rule, brief, p, now)));
        }
        let mut d = match self.check_absent(rule, now, hash, index, None) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        d.stamp(now, cost);
        self.note_hottest(&rule, !d.allowed, now);
        Some(Ok(Some(d)))
    }

    /// An admission-only answer: counted for the hottest keys first, so
    /// that a denial's decision is rendered last, where it is returned (a
    /// decision held across the call would be copied on the way out).
    #[inline(always)]
    fn answer(
        &self,
        rule: &Charge<'_>,
        brief: Brief,
        p: &GcraParams,
        now: u64,
    ) -> Option<Decision> {
        self.note_hottest(rule, matches!(brief, Brief::Denied(_)), now);
        match brief {
            Brief::Admitted => None,
            Brief::Denied(state) => Some(gcra::check(p, state, now, rule.cost)),
        }
    }
}

impl Slot {
    /// [`check`](Slot::check) for a GCRA policy, admission-only; `None` if
    /// the slot holds another algorithm's state.
    #[inline]
    fn admit(&self, p: &GcraParams, now: u64, cost: u64) -> Option<Brief> {
        match self {
            Slot::Gcra(tat, _) => admit_on(tat, p, now, cost, false),
            Slot::Hot(hot, _) => hot.0.admit(p, now, cost),
            Slot::Other(..) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::ManualClock;
    use crate::policy::Policy;
    use crate::store::{Charge, MemoryStore};

    /// The admission-only path and the full check leave the same states and
    /// give the same verdicts, and the same decisions for denials: hot keys
    /// (promoted to a thread cell), plain slots, fresh keys, another
    /// algorithm's key, costs 0 to above the limit.
    #[test]
    fn admission_only_checks_match_full_checks_step_by_step() {
        let clock = ManualClock::new();
        let fast = MemoryStore::builder().clock(clock.clone()).build();
        let full = MemoryStore::builder().clock(clock.clone()).build();
        let gcra = Policy::cell(4, 10, Duration::from_millis(1_500)).unwrap();
        let funnel = Policy::funnel(3, 2.5).unwrap();
        let window = Policy::fixed_window(3, Duration::from_secs(1)).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let keys: [&[u8]; 4] = [b"hot", b"warm", b"cold", b"shared"];
        for step in 0..20_000 {
            // Mostly one key, so it is promoted to the thread's hot cell.
            let key = if next(4) == 0 {
                keys[next(4) as usize]
            } else {
                keys[0]
            };
            let policy = match next(10) {
                0 => &funnel,
                1 if key == b"shared" => &window,
                _ => &gcra,
            };
            let cost = next(7);
            let brief = fast
                .admit_sync(Charge::new(key, policy, cost))
                .expect("in process")
                .unwrap();
            let d = full.check_sync(Charge::new(key, policy, cost)).unwrap();
            match brief {
                None => assert!(d.allowed && d.permit.is_none(), "step {step}: {d:?}"),
                Some(b) => assert_eq!(b, d, "step {step}"),
            }
            clock.advance(Duration::from_micros(next(400_000)));
        }
        // Same states: peeks agree for every key and policy.
        for key in keys {
            for policy in [&gcra, &funnel, &window] {
                let a = fast.check_sync(Charge::new(key, policy, 0)).unwrap();
                let b = full.check_sync(Charge::new(key, policy, 0)).unwrap();
                assert_eq!(a, b);
            }
        }
    }
}
