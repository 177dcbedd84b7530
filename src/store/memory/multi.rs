//! Several rules in one atomic check: the write locks of every shard they
//! touch, taken in index order, exclude all other writers to those keys, and
//! the lock of the shared counters (always taken after the shards') excludes
//! every other writer to those.

use std::sync::atomic::Ordering;
use std::sync::RwLockWriteGuard;

use super::overflow::StatesGuard;
use super::{write, MemoryStore, Ns, Shard, Slot};
use crate::clock::Clock;
use crate::decision::{Decision, PermitId};
use crate::store::{Charge, StoreError};

impl<C: Clock> MemoryStore<C> {
    /// Decides several rules atomically, synchronously. [`Store::check_all`](crate::Store::check_all) calls this.
    pub fn check_all_sync(&self, rules: &[Charge<'_>]) -> Result<Vec<Decision>, StoreError> {
        if let [rule] = rules {
            return self.check_sync(*rule).map(|d| vec![d]);
        }
        let now = self.inner.clock.now_ns();
        let answer = self.check_many(rules, now);
        if let Ok(decisions) = &answer {
            for (rule, d) in rules.iter().zip(decisions) {
                self.note_hottest(rule, !d.allowed, now);
            }
        }
        answer
    }

    /// [`check_all_sync`](Self::check_all_sync) of two rules or more: the
    /// locks, the room for new keys, the decisions, then the charges (or the
    /// peeks of a denial), each a step below.
    fn check_many(&self, rules: &[Charge<'_>], now: u64) -> Result<Vec<Decision>, StoreError> {
        let located: Vec<(u64, usize)> = rules.iter().map(|r| self.locate(r.key)).collect();
        let mut hashes: Vec<u64> = located.iter().map(|&(h, _)| h).collect();
        hashes.sort_unstable();
        if hashes.windows(2).any(|w| w[0] == w[1]) {
            return Err(StoreError::InvalidRequest("two rules name the same key"));
        }
        let mut locked = self.lock(rules, &located);
        let permits: Vec<Option<PermitId>> = rules
            .iter()
            .map(|r| r.policy.is_concurrency().then(|| self.next_permit()))
            .collect();
        let places = self.places(&mut locked, rules, &located, &hashes, now)?;
        let mut states = (places.iter())
            .any(|p| matches!(p, Place::Overflow(..)))
            .then(|| self.overflow_states());
        let step = Step {
            rules,
            located: &located,
            places: &places,
            now,
        };
        let decisions = match self.peeks(&mut locked, &mut states, &step, &permits) {
            Ok(decisions) => decisions,
            Err(e) => {
                unreserve_places(self, &places);
                return Err(e);
            }
        };
        if !crate::store::all_allowed(&decisions) {
            unreserve_places(self, &places);
            // Nothing is charged: rules that would have passed report a peek.
            return Ok(self.denial_peeks(&mut locked, &mut states, &step, decisions));
        }
        let mut decisions = self.charge(&mut locked, &mut states, &step, &permits, decisions)?;
        for (d, rule) in decisions.iter_mut().zip(rules) {
            d.stamp(now, rule.cost);
        }
        Ok(decisions)
    }

    /// The write locks of every shard `located` names, in index order so
    /// concurrent multi-rule checks cannot deadlock. Hot keys this check
    /// may charge come back under the locks alone: no thread cache can
    /// write them until these locks are released. (A rule of cost 0 only
    /// reads its key: a snapshot of the cell is enough.)
    #[inline(always)]
    fn lock<'s>(&'s self, rules: &[Charge<'_>], located: &[(u64, usize)]) -> Locked<'s> {
        let mut order: Vec<usize> = located.iter().map(|&(_, s)| s).collect();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| write(self.shard(i))).collect();
        let mut locked = Locked { order, guards };
        for (rule, &(hash, shard)) in rules.iter().zip(located) {
            if rule.cost > 0 {
                if let Some(slot) = locked.shard(shard).slots.get_mut(&hash) {
                    slot.demote();
                }
            }
        }
        locked
    }

    /// Room first: a charged rule whose key is absent takes a key of its
    /// namespace's cap, or is decided on the namespace's shared counter.
    #[inline(always)]
    fn places(
        &self,
        locked: &mut Locked<'_>,
        rules: &[Charge<'_>],
        located: &[(u64, usize)],
        hashes: &[u64],
        now: u64,
    ) -> Result<Vec<Place>, StoreError> {
        let mut places = Vec::with_capacity(rules.len());
        for (rule, &(hash, shard)) in rules.iter().zip(located) {
            let shard = locked.shard(shard);
            let place = if rule.cost > 0 && !shard.slots.contains_key(&hash) {
                let ns = self.space_of(rule);
                if self.make_room(shard, now, ns, rule.policy, hashes) {
                    Place::New(ns)
                } else if rule.penalty {
                    unreserve_places(self, &places);
                    return Err(self.penalty_room_full());
                } else {
                    self.note_overflow(ns, now);
                    Place::Overflow(ns, self.inner.overflow.bucket_of(hash))
                }
            } else {
                Place::Own
            };
            places.push(place);
        }
        Ok(places)
    }

    /// Every rule's decision as a peek of its charge, nothing changed.
    #[inline(always)]
    fn peeks(
        &self,
        locked: &mut Locked<'_>,
        states: &mut Option<StatesGuard<'_>>,
        step: &Step<'_, '_>,
        permits: &[Option<PermitId>],
    ) -> Result<Vec<Decision>, StoreError> {
        let (rules, places, now) = (step.rules, step.places, step.now);
        let mut decisions = Vec::with_capacity(rules.len());
        for (i, ((rule, &(hash, shard)), &permit)) in
            rules.iter().zip(step.located).zip(permits).enumerate()
        {
            let d = if let Place::Overflow(ns, bucket) = places[i] {
                // Rules of this check on one shared counter are charged together.
                let cost = (rules.iter().zip(places))
                    .filter(|&(r, &p)| p == places[i] && r.policy == rule.policy)
                    .fold(0u64, |sum, (r, _)| sum.saturating_add(r.cost));
                let states = states.as_mut().expect("locked when a rule overflows");
                let slot = self.overflow_slot(states, ns, bucket, rule.policy, now)?;
                slot.peek_as(rule.policy, now, cost, permit)
            } else {
                let existing = locked.shard(shard).slots.get(&hash);
                existing.and_then(|s| s.peek_as(rule.policy, now, rule.cost, permit))
            };
            decisions.push(d.unwrap_or_else(|| fresh_peek(rule, now, rule.cost, permit)));
        }
        Ok(decisions)
    }

    /// A denial's decisions: the rules that would have passed report a
    /// peek of cost 0.
    fn denial_peeks(
        &self,
        locked: &mut Locked<'_>,
        states: &mut Option<StatesGuard<'_>>,
        step: &Step<'_, '_>,
        mut decisions: Vec<Decision>,
    ) -> Vec<Decision> {
        let now = step.now;
        for (i, (rule, &(hash, shard))) in step.rules.iter().zip(step.located).enumerate() {
            if !decisions[i].allowed {
                continue;
            }
            let peek = match (step.places[i], states.as_mut()) {
                (Place::Overflow(ns, bucket), Some(states)) => {
                    (self.overflow_slot(states, ns, bucket, rule.policy, now))
                        .ok()
                        .and_then(|s| s.peek_as(rule.policy, now, 0, None))
                }
                _ => {
                    let slot = locked.shard(shard).slots.get(&hash);
                    slot.and_then(|s| s.peek_as(rule.policy, now, 0, None))
                }
            };
            decisions[i] = peek.unwrap_or_else(|| fresh_peek(rule, now, 0, None));
        }
        decisions
    }

    /// Charges every rule of an admission, under the locks that decided it.
    #[inline(always)]
    fn charge(
        &self,
        locked: &mut Locked<'_>,
        states: &mut Option<StatesGuard<'_>>,
        step: &Step<'_, '_>,
        permits: &[Option<PermitId>],
        mut decisions: Vec<Decision>,
    ) -> Result<Vec<Decision>, StoreError> {
        let now = step.now;
        for (i, ((rule, &(hash, shard)), &permit)) in
            step.rules.iter().zip(step.located).zip(permits).enumerate()
        {
            if rule.cost == 0 {
                continue;
            }
            if let (Place::Overflow(ns, bucket), Some(states)) = (step.places[i], states.as_mut()) {
                let slot = self.overflow_slot(states, ns, bucket, rule.policy, now)?;
                let d = slot.check(rule.policy, now, rule.cost, permit);
                debug_assert!(d.is_some_and(|d| d.allowed), "admitted under the same lock");
                // Charged one by one: each reports what its own charge left.
                decisions[i] = d.unwrap_or(decisions[i]);
                continue;
            }
            let shard = locked.shard(shard);
            let slot = shard.slots.entry(hash).or_insert_with(|| {
                let ns = match step.places[i] {
                    Place::New(ns) => ns,
                    // A cold key of this check swept while making room for
                    // another comes back, and is counted again.
                    _ => {
                        let ns = self.space_of(rule);
                        let space = &self.inner.spaces[ns as usize];
                        space.live.fetch_add(1, Ordering::Relaxed);
                        ns
                    }
                };
                Slot::fresh(rule.policy, ns)
            });
            if !slot.matches(rule.policy) {
                *slot = Slot::fresh(rule.policy, slot.ns());
            }
            let d = slot.check(rule.policy, now, rule.cost, permit);
            debug_assert!(
                d.is_some_and(|d| d.allowed),
                "admitted under the same locks"
            );
            let at = slot.expires_at();
            shard.next_expiry = shard.next_expiry.min(at);
        }
        Ok(decisions)
    }
}

/// The write locks of a multi-rule check, one per shard, in index order.
struct Locked<'s> {
    order: Vec<usize>,
    guards: Vec<RwLockWriteGuard<'s, Shard>>,
}

impl Locked<'_> {
    /// The locked shard `index`.
    #[inline(always)]
    fn shard(&mut self, index: usize) -> &mut Shard {
        let at = self.order.binary_search(&index).unwrap_or(0);
        &mut self.guards[at]
    }
}

/// What every step of a multi-rule check reads.
struct Step<'a, 'k> {
    rules: &'a [Charge<'k>],
    located: &'a [(u64, usize)],
    places: &'a [Place],
    now: u64,
}

/// Gives back the room taken for the new keys of a check that charges
/// nothing.
fn unreserve_places<C: Clock>(store: &MemoryStore<C>, places: &[Place]) {
    for place in places {
        if let Place::New(ns) = *place {
            let space = &store.inner.spaces[ns as usize];
            space.live.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Where a rule of a multi-rule check is decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// On its key's own state: a key held, or a peek.
    Own,
    /// On a new key given room in namespace `ns`: inserted if admitted.
    New(Ns),
    /// On the shared counter of full namespace `ns` that the key's hash
    /// picks (its bucket).
    Overflow(Ns, u32),
}

fn fresh_peek(rule: &Charge<'_>, now: u64, cost: u64, permit: Option<PermitId>) -> Decision {
    Slot::decide_fresh(rule.policy, now, cost, permit, false).1
}
