//! Slow, obviously-correct reference models of every algorithm.
//!
//! Each model keeps the plainest state (one entry per admitted unit, exact
//! fractions), answers "is a cost-k request admissible at time t?" directly
//! from the definition, and derives `remaining` and `retry_after` by search
//! over that predicate — not by the closed forms the crate uses.

use std::collections::HashMap;
use std::time::Duration;

use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::{Algorithm, Policy};

/// One key's model state for any algorithm.
#[derive(Clone, Debug, Default)]
struct ModelKey {
    /// GCRA as a leaky bucket: content (ns of work) measured at `at`.
    level: u128,
    at: u64,
    /// Logs: one timestamp per admitted unit. Concurrency: (id, expiry) per unit.
    units: Vec<u64>,
    leases: Vec<(u64, u64)>,
    /// Fixed / sliding windows: admitted units per window index.
    per_window: HashMap<u64, u64>,
}

/// The model of a whole store: keys → state, one policy per key. `Default`
/// is an empty store.
#[derive(Default)]
pub struct Model {
    keys: HashMap<Vec<u8>, ModelKey>,
}

fn d(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap())
}

impl ModelKey {
    fn gcra_level(&self, now: u64) -> u128 {
        // The bucket drains one ns of work per ns; a clock before `at` sees
        // the level as of `at` plus the gap (same instant of emptying).
        let empties_at = u128::from(self.at) + self.level;
        empties_at.saturating_sub(u128::from(now))
    }

    fn live_units(&self, w: u64, t: u64) -> usize {
        self.units
            .iter()
            .filter(|&&u| u128::from(u) + u128::from(w) > u128::from(t))
            .count()
    }

    /// Exact estimate·w of the sliding window counter at time t.
    fn sliding_estimate_w(&self, w: u64, t: u64) -> u128 {
        let idx = t / w;
        let elapsed = u128::from(t - idx * w);
        let cur = u128::from(*self.per_window.get(&idx).unwrap_or(&0));
        let prev = if idx == 0 {
            0
        } else {
            u128::from(*self.per_window.get(&(idx - 1)).unwrap_or(&0))
        };
        prev * (u128::from(w) - elapsed) + cur * u128::from(w)
    }

    fn in_flight(&self, t: u64) -> usize {
        self.leases.iter().filter(|&&(_, exp)| exp > t).count()
    }

    /// Is a request of `cost` admissible at time t, from this state?
    fn admissible(&self, policy: &Policy, t: u64, cost: u64) -> bool {
        match policy.algorithm() {
            Algorithm::Gcra(p) => {
                self.gcra_level(t) + u128::from(p.emission_interval_ns) * u128::from(cost)
                    <= u128::from(p.tolerance_ns)
            }
            Algorithm::SlidingLog(p) => {
                self.live_units(p.window_ns, t) as u128 + u128::from(cost) <= u128::from(p.max)
            }
            Algorithm::FixedWindow(p) => {
                let used = *self.per_window.get(&(t / p.window_ns)).unwrap_or(&0);
                u128::from(used) + u128::from(cost) <= u128::from(p.max)
            }
            Algorithm::SlidingWindow(p) => {
                self.sliding_estimate_w(p.window_ns, t) + u128::from(cost) * u128::from(p.window_ns)
                    <= u128::from(p.max) * u128::from(p.window_ns)
            }
            Algorithm::Concurrency(p) => {
                self.in_flight(t) as u128 + u128::from(cost) <= u128::from(p.max_in_flight)
            }
        }
    }

    /// The largest k admissible now (linear search: limits in tests are small).
    fn remaining(&self, policy: &Policy, now: u64) -> u64 {
        // Policy::cell reports redis-cell 0.5.0's `remaining` by its own
        // definition: (τ − content) and T truncated to whole µs, divided in
        // f64, truncated (T ≥ 1 µs; below, redis-cell divides by zero).
        if let (Algorithm::Gcra(p), Some(_)) = (policy.algorithm(), policy.cell_args()) {
            if p.emission_interval_ns >= 1000 {
                let next = u128::from(p.tolerance_ns).saturating_sub(self.gcra_level(now));
                let q = (next / 1000) as f64 / (p.emission_interval_ns / 1000) as f64;
                return q as u64;
            }
        }
        let mut k = 0;
        while k < policy.limit() && self.admissible(policy, now, k + 1) {
            k += 1;
        }
        k
    }

    /// When a denied `cost` request becomes admissible: the first admissible
    /// instant, found by binary search (every model's admissibility is
    /// monotone in time when nothing is admitted).
    fn retry_after(&self, policy: &Policy, now: u64, cost: u64) -> Option<Duration> {
        if cost > policy.limit() {
            return None;
        }
        let horizon = match policy.algorithm() {
            Algorithm::Gcra(p) => p.tolerance_ns as u128 * 2 + self.gcra_level(now),
            _ => policy.window().as_nanos() * 3,
        };
        let (mut lo, mut hi) = (u128::from(now), u128::from(now) + horizon);
        assert!(
            self.admissible(policy, hi as u64, cost),
            "model horizon too short"
        );
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.admissible(policy, mid as u64, cost) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(d(lo - u128::from(now)))
    }

    /// When `remaining` grows by one: when one more unit than now becomes
    /// admissible (zero if every unit already is).
    fn quota_after(&self, policy: &Policy, now: u64) -> Duration {
        let r = self.remaining(policy, now);
        if r >= policy.limit() {
            return Duration::ZERO;
        }
        self.retry_after(policy, now, r + 1).unwrap_or_default()
    }

    fn reset_after(&self, policy: &Policy, now: u64) -> Duration {
        let at = match policy.algorithm() {
            Algorithm::Gcra(_) => return d(self.gcra_level(now)),
            Algorithm::SlidingLog(p) => self
                .units
                .iter()
                .map(|&u| u128::from(u) + u128::from(p.window_ns))
                .max(),
            Algorithm::FixedWindow(p) => {
                let idx = now / p.window_ns;
                self.per_window
                    .get(&idx)
                    .filter(|&&c| c > 0)
                    .map(|_| u128::from(idx + 1) * u128::from(p.window_ns))
            }
            Algorithm::SlidingWindow(p) => {
                let idx = now / p.window_ns;
                let w = u128::from(p.window_ns);
                if self.per_window.get(&idx).is_some_and(|&c| c > 0) {
                    Some((u128::from(idx) + 2) * w)
                } else if idx > 0 && self.per_window.get(&(idx - 1)).is_some_and(|&c| c > 0) {
                    Some((u128::from(idx) + 1) * w)
                } else {
                    None
                }
            }
            Algorithm::Concurrency(_) => self
                .leases
                .iter()
                .filter(|&&(_, e)| e > now)
                .map(|&(_, e)| u128::from(e))
                .max(),
        };
        at.map_or(Duration::ZERO, |at| d(at.saturating_sub(u128::from(now))))
    }

    fn admit(&mut self, policy: &Policy, now: u64, cost: u64, permit: u64) {
        match policy.algorithm() {
            Algorithm::Gcra(p) => {
                self.level =
                    self.gcra_level(now) + u128::from(p.emission_interval_ns) * u128::from(cost);
                self.at = now;
            }
            Algorithm::SlidingLog(_) => self.units.extend(std::iter::repeat_n(now, cost as usize)),
            Algorithm::FixedWindow(p) | Algorithm::SlidingWindow(p) => {
                *self.per_window.entry(now / p.window_ns).or_default() += cost
            }
            Algorithm::Concurrency(p) => self.leases.extend(std::iter::repeat_n(
                (permit, now + p.lease_ns),
                cost as usize,
            )),
        }
    }
}

impl Model {
    /// A check of `cost` units at `now`; `permit` is the id an admitted
    /// concurrency check holds.
    pub fn check(
        &mut self,
        key: &[u8],
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: u64,
    ) -> Decision {
        let state = self.keys.entry(key.to_vec()).or_default();
        let allowed = state.admissible(policy, now, cost);
        if allowed && cost > 0 {
            state.admit(policy, now, cost, permit);
        }
        let permit = (allowed && cost > 0 && policy.is_concurrency()).then_some(PermitId(permit));
        // What the charge took, and when.
        let charged = if allowed { cost } else { 0 };
        Decision {
            charged,
            charged_at_ns: if charged > 0 { now } else { 0 },
            decided_by: Default::default(),
            allowed,
            limit: policy.limit(),
            remaining: state.remaining(policy, now),
            retry_after: if allowed {
                None
            } else {
                state.retry_after(policy, now, cost)
            },
            reset_after: state.reset_after(policy, now),
            quota_after: state.quota_after(policy, now),
            permit,
        }
    }

    /// All-or-nothing over several rules (distinct keys): when one denies,
    /// nothing is consumed and the rules that would pass report a peek.
    pub fn check_all(&mut self, rules: &[(&[u8], &Policy, u64, u64)], now: u64) -> Vec<Decision> {
        let pass = rules.iter().all(|&(k, p, cost, _)| {
            self.keys
                .get(k)
                .cloned()
                .unwrap_or_default()
                .admissible(p, now, cost)
        });
        rules
            .iter()
            .map(|&(k, p, cost, permit)| {
                let would_pass = self
                    .keys
                    .get(k)
                    .cloned()
                    .unwrap_or_default()
                    .admissible(p, now, cost);
                let cost = if pass || !would_pass { cost } else { 0 };
                self.check(k, p, now, cost, permit)
            })
            .collect()
    }

    /// Gives back the units of one charge, from where it was taken: the
    /// units it added that are still counted, and nothing else.
    pub fn refund(&mut self, key: &[u8], policy: &Policy, now: u64, receipt: &Receipt) {
        let Some(s) = self.keys.get_mut(key) else {
            return;
        };
        let (at, units) = (receipt.at_ns(), receipt.units());
        match policy.algorithm() {
            Algorithm::Gcra(p) => {
                // The charge poured `work` into the bucket at `at`; however
                // other refunds moved the content since, that work drains
                // no sooner than from `at` on, so what of it can still be
                // in the bucket is what `now − at` of draining leaves.
                let work = u128::from(p.emission_interval_ns) * u128::from(units);
                let left = work.saturating_sub(u128::from(now.saturating_sub(at)));
                s.level = s.gcra_level(now).saturating_sub(left);
                s.at = now;
            }
            Algorithm::SlidingLog(p) => {
                s.units
                    .retain(|&u| u128::from(u) + u128::from(p.window_ns) > u128::from(now));
                // Units at one instant are alike: take `units` of those at `at`.
                let mut take = units;
                s.units.retain(|&u| {
                    let drop = u == at && take > 0;
                    take -= u64::from(drop);
                    !drop
                });
            }
            Algorithm::FixedWindow(p) => {
                // A window that has ended keeps its count.
                let w = at / p.window_ns;
                if w >= now / p.window_ns {
                    if let Some(c) = s.per_window.get_mut(&w) {
                        *c = c.saturating_sub(units);
                    }
                }
            }
            Algorithm::SlidingWindow(p) => {
                // A window still weighs in the estimate for one window after it.
                let w = at / p.window_ns;
                if w + 1 >= now / p.window_ns {
                    if let Some(c) = s.per_window.get_mut(&w) {
                        *c = c.saturating_sub(units);
                    }
                }
            }
            Algorithm::Concurrency(_) => {
                s.leases.retain(|&(_, e)| e > now);
                let mut take = units;
                s.leases.retain(|&(id, _)| {
                    let drop = Some(PermitId(id)) == receipt.permit() && take > 0;
                    take -= u64::from(drop);
                    !drop
                });
            }
        }
    }

    /// Releases one permit.
    pub fn release(&mut self, key: &[u8], permit: u64) {
        if let Some(s) = self.keys.get_mut(key) {
            s.leases.retain(|&(id, _)| id != permit);
        }
    }

    /// Forgets a key.
    pub fn reset(&mut self, key: &[u8]) {
        self.keys.remove(key);
    }
}
