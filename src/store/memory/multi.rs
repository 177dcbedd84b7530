//! Several rules in one atomic check: the write locks of every shard they
//! touch, taken in index order, exclude all other writers to those keys.

use std::sync::atomic::Ordering;
use std::sync::RwLockWriteGuard;

use super::{write, MemoryStore, Shard, Slot};
use crate::clock::Clock;
use crate::decision::{Decision, PermitId};
use crate::store::{Rule, StoreError};

impl<C: Clock> MemoryStore<C> {
    /// Decides several rules atomically, synchronously. [`Store::check_all`](crate::Store::check_all) calls this.
    pub fn check_all_sync(&self, rules: &[Rule<'_>]) -> Result<Vec<Decision>, StoreError> {
        if let [rule] = rules {
            return self.check_sync(*rule).map(|d| vec![d]);
        }
        let now = self.inner.clock.now_ns();
        let located: Vec<(u64, usize)> = rules.iter().map(|r| self.locate(r.key)).collect();
        let mut hashes: Vec<u64> = located.iter().map(|&(h, _)| h).collect();
        hashes.sort_unstable();
        if hashes.windows(2).any(|w| w[0] == w[1]) {
            return Err(StoreError::InvalidRequest("two rules name the same key"));
        }
        let mut order: Vec<usize> = located.iter().map(|&(_, s)| s).collect();
        order.sort_unstable();
        order.dedup();
        // Lock in index order so concurrent multi-rule checks cannot deadlock.
        let mut guards: Vec<(usize, RwLockWriteGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, write(self.shard(i)))).collect();
        let guard_of = |i: usize| order.binary_search(&i).unwrap_or(0);
        // Hot keys this check may charge come back under the locks alone: no
        // thread cache can write them until these locks are released. (A
        // rule of cost 0 only reads its key: a snapshot of the cell is enough.)
        for (rule, &(hash, shard)) in rules.iter().zip(&located) {
            if rule.cost > 0 {
                if let Some(slot) = guards[guard_of(shard)].1.slots.get_mut(&hash) {
                    slot.demote();
                }
            }
        }
        let permits: Vec<Option<PermitId>> = rules
            .iter()
            .map(|r| r.policy.is_concurrency().then(|| self.next_permit()))
            .collect();

        let mut decisions = Vec::with_capacity(rules.len());
        let mut new_keys = vec![0usize; order.len()];
        for ((rule, &(hash, shard)), &permit) in rules.iter().zip(&located).zip(&permits) {
            let g = guard_of(shard);
            let existing = guards[g].1.slots.get(&hash);
            let live = existing.and_then(|s| s.peek_as(rule.policy, now, rule.cost, permit));
            let d = match live {
                Some(d) => d,
                None => {
                    new_keys[g] += usize::from(rule.cost > 0 && existing.is_none());
                    Slot::fresh(rule.policy)
                        .peek_as(rule.policy, now, rule.cost, permit)
                        .expect("a fresh slot matches its policy")
                }
            };
            decisions.push(d);
        }
        if !crate::store::all_allowed(&decisions) {
            // Nothing is charged: rules that would have passed report a peek.
            for ((rule, &(hash, shard)), d) in rules.iter().zip(&located).zip(&mut decisions) {
                if d.allowed {
                    let slot = guards[guard_of(shard)].1.slots.get(&hash);
                    let peek = slot.and_then(|s| s.peek_as(rule.policy, now, 0, None));
                    *d = peek.unwrap_or_else(|| {
                        Slot::fresh(rule.policy)
                            .peek_as(rule.policy, now, 0, None)
                            .expect("a fresh slot matches its policy")
                    });
                }
            }
            return Ok(decisions);
        }
        for (g, &extra) in new_keys.iter().enumerate() {
            if extra > 0 {
                self.make_room(&mut guards[g].1, now, extra)?;
            }
        }
        // Keys inserted per shard: more than `new_keys` when making room swept
        // a cold key of this very check, which then comes back.
        let mut inserted = vec![0usize; order.len()];
        for ((rule, &(hash, shard)), &permit) in rules.iter().zip(&located).zip(&permits) {
            if rule.cost == 0 {
                continue;
            }
            let g = guard_of(shard);
            let shard = &mut guards[g].1;
            let slot = shard.slots.entry(hash).or_insert_with(|| {
                inserted[g] += 1;
                Slot::fresh(rule.policy)
            });
            if !slot.matches(rule.policy) {
                *slot = Slot::fresh(rule.policy);
            }
            let d = slot.check(rule.policy, now, rule.cost, permit);
            debug_assert!(
                d.is_some_and(|d| d.allowed),
                "admitted under the same locks"
            );
            let at = slot.expires_at();
            shard.next_expiry = shard.next_expiry.min(at);
        }
        let uncounted: usize = inserted
            .iter()
            .zip(&new_keys)
            .map(|(&inserted, &counted)| inserted.saturating_sub(counted))
            .sum();
        if uncounted > 0 {
            self.inner.live.fetch_add(uncounted, Ordering::Relaxed);
        }
        Ok(decisions)
    }
}
