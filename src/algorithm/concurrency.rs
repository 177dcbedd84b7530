//! The concurrency limit: leased permits, released when the work finishes.
//!
//! A guard that counts requests in flight in one shared counter, and
//! deletes it when a request finishes, lets one finishing request wipe the
//! count of every other. Here each admission is a
//! permit with its own id and lease: releasing one removes only that one, and
//! a holder that crashed loses its permit when the lease runs out.

use super::dur;
use super::ConcurrencyParams;
use crate::decision::{Decision, PermitId, Receipt};

/// One permit: who holds it, until when, for how many units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The id handed to the holder.
    pub id: PermitId,
    /// The permit lapses once `now ≥ expires_at`.
    pub expires_at: u64,
    /// Units it holds (the request's cost).
    pub units: u64,
}

/// Permits in flight. `Default` is a fresh key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// Live (and possibly lapsed, until pruned) leases.
    pub leases: Vec<Lease>,
}

fn in_flight(s: &ConcurrencyState, now: u64) -> u64 {
    s.leases
        .iter()
        .filter(|l| l.expires_at > now)
        .map(|l| l.units)
        .sum()
}

/// Decides a request of `cost` units; `permit` is the id it will hold if admitted.
pub fn check(
    p: &ConcurrencyParams,
    s: &ConcurrencyState,
    now: u64,
    cost: u64,
    permit: PermitId,
) -> Decision {
    let held = in_flight(s, now);
    let allowed = u128::from(held) + u128::from(cost) <= u128::from(p.max_in_flight);
    let until = |t: u64| dur(u128::from(t.saturating_sub(now)));
    let last_expiry = s
        .leases
        .iter()
        .filter(|l| l.expires_at > now)
        .map(|l| l.expires_at)
        .max();
    let reset_at = if allowed && cost > 0 {
        Some(now.saturating_add(p.lease_ns).max(last_expiry.unwrap_or(0)))
    } else {
        last_expiry
    };
    let retry_after = if allowed || cost > p.max_in_flight {
        None
    } else {
        // An upper bound: the leases that must lapse if nobody releases.
        // held + cost − max, without overflow: here cost ≤ max < held + cost.
        let must_free = held - (p.max_in_flight - cost);
        let mut live: Vec<&Lease> = s.leases.iter().filter(|l| l.expires_at > now).collect();
        live.sort_by_key(|l| l.expires_at);
        let mut freed = 0;
        live.into_iter()
            .find(|l| {
                freed += l.units;
                freed >= must_free
            })
            .map(|l| until(l.expires_at))
    };
    let remaining = p
        .max_in_flight
        .saturating_sub(if allowed { held + cost } else { held });
    // An estimate: the earliest lease to lapse if nobody releases sooner.
    let first_expiry = s
        .leases
        .iter()
        .filter(|l| l.expires_at > now && l.units > 0)
        .map(|l| l.expires_at)
        // The new lease lapses at `reset_at` (see `admit`).
        .chain(reset_at.filter(|_| allowed && cost > 0))
        .min();
    Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: p.max_in_flight,
        remaining,
        retry_after,
        reset_after: reset_at.map(until).unwrap_or_default(),
        quota_after: first_expiry
            .filter(|_| remaining < p.max_in_flight)
            .map(until)
            .unwrap_or_default(),
        permit: (allowed && cost > 0).then_some(permit),
    }
}

/// Drops lapsed leases (changes no decision).
pub fn prune(s: &mut ConcurrencyState, now: u64) {
    s.leases.retain(|l| l.expires_at > now);
}

/// Records the permit; call only when [`check`] allowed.
///
/// A `now` earlier than the newest lease's grant (the clock went back, or a
/// caller's reading was overtaken by a check that already pruned the leases
/// lapsed at its later time) still records the permit as granted at that
/// grant: it lapses no sooner than the newest lease. A shorter lease would
/// free room early that the policy never had, like the sliding log's entry
/// kept at its later instant.
pub fn admit(
    p: &ConcurrencyParams,
    s: &mut ConcurrencyState,
    now: u64,
    cost: u64,
    permit: PermitId,
) {
    prune(s, now);
    if cost > 0 {
        let newest = s.leases.iter().map(|l| l.expires_at).max().unwrap_or(0);
        s.leases.push(Lease {
            id: permit,
            expires_at: now.saturating_add(p.lease_ns).max(newest),
            units: cost,
        });
    }
}

/// Releases one permit. Returns whether it was still held.
pub fn release(s: &mut ConcurrencyState, permit: PermitId) -> bool {
    let before = s.leases.len();
    s.leases.retain(|l| l.id != permit);
    s.leases.len() != before
}

/// Gives a charge's units back from the lease of its own permit (not the
/// most recent one, which may be another request's); a lease released or
/// lapsed meanwhile changes nothing.
pub fn refund(s: &mut ConcurrencyState, now: u64, r: &Receipt) {
    prune(s, now);
    let Some(permit) = r.permit() else {
        return;
    };
    let Some(i) = s.leases.iter().position(|l| l.id == permit) else {
        return;
    };
    let lease = &mut s.leases[i];
    lease.units = lease.units.saturating_sub(r.units());
    if lease.units == 0 {
        s.leases.remove(i);
    }
}

/// When the state is indistinguishable from a fresh key.
pub fn expires_at(s: &ConcurrencyState) -> u64 {
    s.leases.iter().map(|l| l.expires_at).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_now_never_shortens_a_lease() {
        let p = ConcurrencyParams {
            max_in_flight: 3,
            lease_ns: 1_000,
        };
        let mut s = ConcurrencyState::default();
        admit(&p, &mut s, 5_000, 1, PermitId(1));
        // Granted on a reading 400 ns older than the newest grant.
        admit(&p, &mut s, 4_600, 1, PermitId(2));
        assert_eq!(s.leases[1].expires_at, 6_000);
        // Both still held where the first is.
        assert!(!check(&p, &s, 5_999, 2, PermitId(3)).allowed);
        // A later reading gets its own full lease.
        admit(&p, &mut s, 5_500, 1, PermitId(3));
        assert_eq!(s.leases[2].expires_at, 6_500);
    }
}
