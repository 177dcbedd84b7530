//! The check of a charge without figures ([`Charge::without_figures`]):
//! [`check_sync`](MemoryStore::check_sync) for a caller that reads nothing
//! of an admission but that it was one (the simple layer's admitted path),
//! so a GCRA admission computes no `remaining`, `reset_after` or
//! `quota_after`. Same state changes, same promotions, same receipts;
//! denials come complete.

use super::hot::{self, admit_on, Brief, Lookup};
use super::slot::Slot;
use super::{read, MemoryStore};
use crate::algorithm::gcra;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::policy::{Algorithm, GcraParams};
use crate::store::{Answer, Charge, Decisions, StoreError};

/// What a check without figures answers: the trait's own type, built where
/// it returns (moving a 112-byte decision into it would copy it, and the
/// copy stalls on the stores that just wrote it).
pub(super) type Admitted = Answer<std::future::Pending<Result<Decisions, StoreError>>>;

impl<C: Clock> MemoryStore<C> {
    /// Decides one charge without figures: a GCRA admission with its
    /// `remaining`, `reset_after` and `quota_after` at 0 (its receipt
    /// complete); every other answer the complete decision
    /// [`check_sync`](Self::check_sync) gives. Every path builds the
    /// trait's own type where it returns, so no answer is copied from one
    /// wrapper into the next on the way out.
    pub(super) fn admit_sync(&self, rule: Charge<'_>) -> Admitted {
        let Algorithm::Gcra(p) = rule.policy.algorithm() else {
            return Answer::Now(self.check_sync(rule).map(Decisions::one));
        };
        let now = self.inner.clock.now_ns();
        let (hash, index) = self.locate(rule.key);
        let cost = rule.cost;
        let promote = match hot::check_with(self.inner.id, hash, |c| c.admit(p, now, cost)) {
            Lookup::Hit(brief) => return self.answer(&rule, brief, p, now),
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
            return self.answer(&rule, brief, p, now);
        }
        let mut d = match self.check_absent(rule, now, hash, index, None) {
            Ok(d) => d,
            Err(e) => return Answer::Now(Err(e)),
        };
        d.stamp(now, cost);
        self.note_hottest(&rule, !d.allowed, now);
        Answer::Now(Ok(Decisions::one(d)))
    }

    /// An answer without figures: counted for the hottest keys first, so
    /// that a denial's decision is rendered last, where it is returned (a
    /// decision held across the call would be copied on the way out).
    #[inline(always)]
    fn answer(&self, rule: &Charge<'_>, brief: Brief, p: &GcraParams, now: u64) -> Admitted {
        self.note_hottest(rule, matches!(brief, Brief::Denied(_)), now);
        Answer::Now(Ok(Decisions::one(match brief {
            Brief::Admitted => {
                let mut d = Decision::admitted_without_figures(p.limit);
                d.stamp(now, rule.cost);
                d
            }
            Brief::Denied(state) => gcra::check(p, state, now, rule.cost),
        })))
    }
}

impl Slot {
    /// [`check`](Slot::check) for a GCRA policy, without figures; `None` if
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
    use crate::decision::Decision;
    use crate::policy::Policy;
    use crate::store::{Charge, MemoryStore, Store};

    /// A check without figures and the full check leave the same states
    /// and give the same verdicts and receipts, and the same decisions for
    /// denials: hot keys
    /// (promoted to a thread cell), plain slots, fresh keys, another
    /// algorithm's key, costs 0 to above the limit.
    #[test]
    fn checks_without_figures_match_full_checks_step_by_step() {
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
            let charge = Charge::new(key, policy, cost);
            let brief = fast.decide(&[charge.without_figures()]).ready();
            let brief = brief.expect("in process").unwrap().into_one().unwrap();
            let d = full.check_sync(charge).unwrap();
            let spared = Decision {
                remaining: 0,
                reset_after: Duration::ZERO,
                quota_after: Duration::ZERO,
                ..d
            };
            if brief.allowed && brief != d {
                // A GCRA admission without figures (a new key is made in full).
                assert_eq!(brief, spared, "step {step}");
            } else {
                assert_eq!(brief, d, "step {step}");
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
