//! Counting hits against matched limits through a crate store.
//!
//! Upstream's fixed window is `after = INCRBY key hits; over iff after >
//! requests_per_unit`: rejected hits still count, and every descriptor is
//! incremented whatever the others say. Here that counter is the crate's
//! fixed window with a limit no request reaches (2^50): it admits every
//! hit, so `after = 2^50 − remaining`. A descriptor's `hits_addend` runs to
//! 2^64 − 1, so one charge takes at most 2^40 of them: more than any
//! `requests_per_unit` (a u32), so the window is over all the same, and
//! the counter saturates at 2^50 rather than refusing (and forgetting) the
//! charge. The window is the crate's `floor(now / unit)` on a Unix-anchored
//! clock: upstream's epoch alignment.
//!
//! On Redis that counter is upstream's own by default: the store counts
//! its charges under upstream's key with `INCRBY` + `EXPIRE`
//! ([`UpstreamCounters`](crate::backend::UpstreamCounters)), and answers the
//! count as the same `2^50 − remaining`. A request's descriptors are
//! checked together (one round trip, as upstream's pipeline), each as if
//! alone, in order.
//!
//! In all-or-nothing mode (`STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT` or
//! `RLS_ALL_OR_NOTHING`) the real limits go through the store's atomic
//! multi-rule check instead: a refused request charges no descriptor.

use std::time::Duration;

use tower_throttle::store::{BoxStore, Charge, Store, StoreError};
use tower_throttle::{Decision, Policy};

use crate::backend::{join, COUNTER_MAX};
use crate::config::{Algorithm, Limit, Unit};

/// The most one request charges the counter: above every
/// `requests_per_unit`, and 1,024 of them fill the counter, which then
/// answers over for every later hit of its window.
const CHARGE_MAX: u64 = 1 << 40;

/// What the store said for one limited descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// Over the limit (before shadow mode).
    pub over: bool,
    /// `limit_remaining`.
    pub remaining: u32,
    /// `duration_until_reset`, whole seconds.
    pub reset_secs: u64,
    /// Fixed windows: the count before and after this request (for the
    /// near/over-limit statistics).
    pub counts: Option<(u64, u64)>,
}

/// One descriptor to count.
pub struct Item<'a> {
    /// Its limit.
    pub limit: &'a Limit,
    /// The counter key.
    pub key: Vec<u8>,
    /// Its hits.
    pub hits: u64,
}

/// The counter policy of each unit.
pub struct Counter {
    policies: [Policy; 7],
}

impl Counter {
    /// The seven counter policies.
    pub fn new() -> Result<Counter, tower_throttle::PolicyError> {
        let units = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        let mut policies = Vec::with_capacity(7);
        for unit in units {
            policies.push(Policy::fixed_window(COUNTER_MAX, unit.window())?);
        }
        let policies = policies
            .try_into()
            .map_err(|_| tower_throttle::PolicyError::ZeroCount("units"))?;
        Ok(Counter { policies })
    }

    fn policy(&self, unit: Unit) -> &Policy {
        let i = match unit {
            Unit::Second => 0,
            Unit::Minute => 1,
            Unit::Hour => 2,
            Unit::Day => 3,
            Unit::Week => 4,
            Unit::Month => 5,
            Unit::Year => 6,
        };
        &self.policies[i]
    }
}

/// `divider − now % divider`: upstream's `CalculateReset`.
pub fn reset_secs(unit: Unit, now_s: u64) -> u64 {
    unit.divider() - now_s % unit.divider()
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Upstream's way: one independent counting check per descriptor, all
/// sent together (polled in order); the first error, if any, once all
/// have answered.
pub async fn count_each(
    store: &BoxStore,
    counter: &Counter,
    items: &[Item<'_>],
    now_s: u64,
) -> Result<Vec<Counted>, StoreError> {
    if let [item] = items {
        return count_one(store, counter, item, now_s)
            .await
            .map(|c| vec![c]);
    }
    let each = items
        .iter()
        .map(|item| count_one(store, counter, item, now_s));
    join::all(each).await.into_iter().collect()
}

async fn count_one(
    store: &BoxStore,
    counter: &Counter,
    item: &Item<'_>,
    now_s: u64,
) -> Result<Counted, StoreError> {
    let unit = item.limit.unit.unwrap_or(Unit::Second);
    Ok(match (item.limit.algorithm, &item.limit.policy) {
        (Algorithm::FixedWindow, _) => {
            let charge = item.hits.min(CHARGE_MAX);
            let d = store
                .check(Charge::new(&item.key, counter.policy(unit), charge))
                .await?;
            // A refused charge (a full counter) leaves the count as it was.
            let charged = if d.allowed { charge } else { 0 };
            let before = COUNTER_MAX
                .saturating_sub(d.remaining)
                .saturating_sub(charged);
            fixed(item.limit, before, item.hits, reset_secs(unit, now_s))
        }
        (_, Some(policy)) => other(
            &store
                .check(Charge::new(&item.key, policy, item.hits))
                .await?,
        ),
        (_, None) => unreachable_policy(),
    })
}

/// An extension algorithm always has a policy (checked at load); should
/// one not, the descriptor is over rather than the server panicking.
fn unreachable_policy() -> Counted {
    Counted {
        over: true,
        remaining: 0,
        reset_secs: 0,
        counts: None,
    }
}

/// Upstream's verdict on a fixed window from the counts.
fn fixed(limit: &Limit, before: u64, hits: u64, reset_secs: u64) -> Counted {
    let after = before.saturating_add(hits);
    let rpu = u64::from(limit.requests_per_unit);
    Counted {
        over: after > rpu,
        remaining: clamp_u32(rpu.saturating_sub(after)),
        reset_secs,
        counts: Some((before, after)),
    }
}

fn other(d: &Decision) -> Counted {
    Counted {
        over: !d.allowed,
        remaining: if d.allowed { clamp_u32(d.remaining) } else { 0 },
        reset_secs: ceil_secs(d.reset_after),
        counts: None,
    }
}

/// All or nothing: the real limits in one atomic check; when any refuses,
/// nothing is charged. A descriptor repeated in one request is one charge
/// of the summed hits (the store's multi-rule check takes distinct keys).
pub async fn count_all(
    store: &BoxStore,
    items: &[Item<'_>],
    now_s: u64,
) -> Result<Vec<Counted>, StoreError> {
    // A shadow-mode limit never refuses a request, so it must not leave the
    // others uncounted: each is checked on its own, the rest together.
    let (shadow, real): (Vec<_>, Vec<_>) = items
        .iter()
        .enumerate()
        .partition(|(_, i)| i.limit.shadow_mode);
    let mut out = vec![None; items.len()];
    let refs: Vec<&Item<'_>> = real.iter().map(|(_, i)| *i).collect();
    for ((at, _), c) in real.iter().zip(count_atomic(store, &refs, now_s).await?) {
        out[*at] = Some(c);
    }
    for (at, item) in shadow {
        out[at] = count_atomic(store, &[item], now_s).await?.pop();
    }
    Ok(out
        .into_iter()
        .map(|c| c.unwrap_or_else(unreachable_policy))
        .collect())
}

/// One all-or-nothing check of `items`. The store's multi-rule check takes
/// one policy per key; a key repeated with another policy (two overrides of
/// one descriptor) goes to a later round, charged only if the first round
/// was not refused (the one case not all or nothing).
async fn count_atomic(
    store: &BoxStore,
    items: &[&Item<'_>],
    now_s: u64,
) -> Result<Vec<Counted>, StoreError> {
    // `requests_per_unit: 0` has no policy: over whenever it is hit.
    let mut refused = items.iter().any(|i| i.limit.policy.is_none() && i.hits > 0);
    let mut out = vec![None; items.len()];
    let mut pending: Vec<usize> = (0..items.len()).collect();
    while !pending.is_empty() {
        let (mut round, mut rest) = (Vec::new(), Vec::new());
        for i in pending {
            let clash = round.iter().any(|&j: &usize| {
                items[j].key == items[i].key && items[j].limit.policy != items[i].limit.policy
            });
            if clash {
                rest.push(i)
            } else {
                round.push(i)
            }
        }
        let batch: Vec<&Item<'_>> = round.iter().map(|&i| items[i]).collect();
        let (counted, round_refused) = one_round(store, &batch, refused, now_s).await?;
        refused |= round_refused;
        for (i, c) in round.into_iter().zip(counted) {
            out[i] = Some(c);
        }
        pending = rest;
    }
    Ok(out
        .into_iter()
        .map(|c| c.unwrap_or_else(unreachable_policy))
        .collect())
}

/// One store call over keys with one policy each; `refused`: only peek.
/// Returns the statuses and whether this round refused the request.
async fn one_round(
    store: &BoxStore,
    items: &[&Item<'_>],
    refused: bool,
    now_s: u64,
) -> Result<(Vec<Counted>, bool), StoreError> {
    let mut slots: Vec<usize> = Vec::with_capacity(items.len());
    let mut unique: Vec<(&[u8], &Policy, u64)> = Vec::new();
    for item in items {
        let Some(policy) = &item.limit.policy else {
            slots.push(usize::MAX);
            continue;
        };
        match unique
            .iter()
            .position(|(k, p, _)| *k == item.key.as_slice() && *p == policy)
        {
            Some(at) => {
                unique[at].2 = unique[at].2.saturating_add(item.hits);
                slots.push(at);
            }
            None => {
                slots.push(unique.len());
                unique.push((&item.key, policy, item.hits));
            }
        }
    }
    let charges: Vec<Charge<'_>> = unique
        .iter()
        .map(|(k, p, cost)| Charge::new(k, p, if refused { 0 } else { *cost }))
        .collect();
    let decisions = if charges.is_empty() {
        Vec::new()
    } else {
        store.check_all(&charges).await?
    };
    let refused = refused || decisions.iter().any(|d| !d.allowed);
    let counted = items
        .iter()
        .zip(&slots)
        .map(|(item, &slot)| {
            let unit = item.limit.unit.unwrap_or(Unit::Second);
            let Some(d) = decisions.get(slot) else {
                return fixed(item.limit, 0, item.hits, reset_secs(unit, now_s));
            };
            match item.limit.algorithm {
                Algorithm::FixedWindow => {
                    let rpu = u64::from(item.limit.requests_per_unit);
                    // The count before: what is left says it, less this
                    // request's charge when it was taken.
                    let charged = if d.allowed && !refused {
                        unique[slot].2
                    } else {
                        0
                    };
                    let before = (rpu - d.remaining.min(rpu)).saturating_sub(charged);
                    let mut c = fixed(item.limit, before, item.hits, reset_secs(unit, now_s));
                    c.over = !d.allowed;
                    if !c.over {
                        c.remaining = clamp_u32(d.remaining);
                    }
                    c
                }
                _ => other(d),
            }
        })
        .collect();
    Ok((counted, refused))
}
