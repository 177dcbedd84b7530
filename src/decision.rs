//! The answer to a check.

use std::time::Duration;

/// Identifies a concurrency permit, to release it early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitId(pub u64);

/// What a store answered for one (key, policy, cost).
///
/// The same shape as redis-cell's `CL.THROTTLE` reply, with full precision;
/// [`Decision::to_cell_reply`] renders the five integers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request was admitted (and its cost consumed).
    pub allowed: bool,
    /// Requests admitted at once from a fresh state.
    pub limit: u64,
    /// Unit requests that would still be admitted now.
    pub remaining: u64,
    /// Denied only: how long until this same request would be admitted.
    /// `None` when allowed, and when denied forever (see [`Decision::is_never`]).
    pub retry_after: Option<Duration>,
    /// How long until the key is back to a fresh state: the legacy
    /// `X-RateLimit-Reset`.
    pub reset_after: Duration,
    /// How long until more quota is made available, that is until
    /// `remaining` grows by one unit: the `t` parameter of the IETF
    /// `RateLimit` field (drafts -10 and -11 of draft-ietf-httpapi-ratelimit-headers). Zero when
    /// `remaining` is already `limit`. Per algorithm: GCRA, the next unit
    /// drips back; sliding log, the oldest unit in the window leaves it;
    /// fixed window, the window ends; sliding window, the estimate drops by
    /// one; concurrency, the earliest lease lapses (an upper bound: a
    /// release frees a unit sooner; a layer's denial lowers it, with
    /// `retry_after`, to the time its permits have recently been held).
    /// Never later than `reset_after`, and for a denied request never later
    /// than `retry_after`.
    pub quota_after: Duration,
    /// Admitted concurrency checks only: the permit to release when done.
    pub permit: Option<PermitId>,
    /// Which store decided: always [`DecidedBy::Primary`] except for the
    /// answers a [`FallbackStore`](crate::store::FallbackStore) gives while
    /// its primary store is unavailable.
    pub decided_by: DecidedBy,
    /// The units this check took: its cost when admitted, 0 for denials
    /// and peeks. With [`Decision::charged_at_ns`], where they were taken:
    /// see [`Decision::receipt`].
    pub charged: u64,
    /// When the units were taken, in ns on the deciding store's clock (0
    /// when nothing was): the check's instant, or the start of the window
    /// they were counted in when the key already held a window later than
    /// that instant's (another process's clock ran ahead, or its call
    /// arrived first). The algorithms' decisions carry that start (0
    /// otherwise) and [`Decision::stamp`] keeps the later of the two, so a
    /// receipt names the window that counted the charge.
    pub charged_at_ns: u64,
}

/// Where an admitted charge was taken: the slot of the key's state that a
/// refund gives units back to.
///
/// A refund by key at the time of the refund would land in whatever slot is
/// current then — the next fixed window, the newest entry of a log, a GCRA
/// state that has already paid the charge off — and so let more through
/// than the limit. A receipt names the charge's own slot, from its instant:
/// the fixed or sliding window it was counted in, the log entries recorded
/// at it, the concurrency permit it took, and for GCRA the debt it added,
/// less what the time since it was taken has already paid off (a GCRA
/// charge of `n` units held for `d` gives back `n·T − d`, nothing once
/// `d ≥ n·T`). A refund whose slot has passed changes nothing.
///
/// Settle a receipt once: refund it, or a [part](Receipt::part) of it, a
/// single time (parts of one receipt may be refunded separately as long as
/// they add up to no more than its units).
///
/// Read it from an admitted decision ([`Decision::receipt`]; stores stamp
/// what it needs with [`Decision::stamp`]); [`Receipt::new`] is for
/// stores and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Receipt {
    units: u64,
    at_ns: u64,
    permit: Option<PermitId>,
    decided_by: DecidedBy,
}

impl Receipt {
    /// A charge of `units` taken at `at_ns` on the deciding store's clock,
    /// holding `permit` (concurrency only).
    pub fn new(units: u64, at_ns: u64, permit: Option<PermitId>) -> Self {
        Receipt {
            units,
            at_ns,
            permit,
            decided_by: DecidedBy::Primary,
        }
    }

    /// The same charge, marked as decided by `by` (what a
    /// [`FallbackStore`](crate::store::FallbackStore) routes refunds by).
    #[must_use]
    pub fn decided_by(self, by: DecidedBy) -> Self {
        Receipt {
            decided_by: by,
            ..self
        }
    }

    /// The same charge, holding `permit` instead (a store that renumbers
    /// the permits of the store behind it).
    #[must_use]
    pub fn with_permit(self, permit: Option<PermitId>) -> Self {
        Receipt { permit, ..self }
    }

    /// A receipt for `units` of this charge (at most all of them), to give
    /// back part of it.
    #[must_use]
    pub fn part(self, units: u64) -> Self {
        Receipt {
            units: units.min(self.units),
            ..self
        }
    }

    /// The units charged: the most a refund of this receipt gives back.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The instant of the charge, in ns on the deciding store's clock.
    pub fn at_ns(&self) -> u64 {
        self.at_ns
    }

    /// Concurrency: the permit the charge holds.
    pub fn permit(&self) -> Option<PermitId> {
        self.permit
    }

    /// Which store of a fallback pair took the charge.
    pub fn store(&self) -> DecidedBy {
        self.decided_by
    }
}

/// Which store of a [`FallbackStore`](crate::store::FallbackStore) decided.
///
/// Stores without a fallback always answer [`DecidedBy::Primary`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DecidedBy {
    /// The store asked (the primary store of a fallback pair).
    #[default]
    Primary,
    /// The fallback store, because the primary was unavailable.
    Fallback,
}

impl Decision {
    /// An admission of a check without figures (see
    /// [`Charge::without_figures`](crate::store::Charge::without_figures)):
    /// allowed under `limit`, its figures 0, nothing charged until
    /// [`Decision::stamp`]ed.
    pub(crate) fn admitted_without_figures(limit: u64) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining: 0,
            retry_after: None,
            reset_after: Duration::ZERO,
            quota_after: Duration::ZERO,
            permit: None,
            decided_by: DecidedBy::Primary,
            charged: 0,
            charged_at_ns: 0,
        }
    }

    /// Records on this decision, of a charge of `cost` units made at
    /// `now_ns` on the deciding store's clock, what it took ([`Decision::charged`],
    /// [`Decision::charged_at_ns`]) when it admitted at least one unit
    /// (denials and peeks take nothing). Every store of this crate stamps
    /// its decisions here; a store of your own should too. A charge the
    /// algorithm counted in a later window than `now_ns`'s keeps that
    /// window's start (see [`Decision::charged_at_ns`]).
    #[inline]
    pub fn stamp(&mut self, now_ns: u64, cost: u64) {
        if self.allowed && cost > 0 {
            self.charged = cost;
            self.charged_at_ns = self.charged_at_ns.max(now_ns);
        }
    }

    /// Where an admitted check's units were taken, to give them back
    /// ([`Store::refund`]) into that slot and nowhere else: `None` for
    /// denials and peeks, which took nothing.
    ///
    /// [`Store::refund`]: crate::store::Store::refund
    #[inline]
    pub fn receipt(&self) -> Option<Receipt> {
        (self.charged > 0).then(|| {
            Receipt::new(self.charged, self.charged_at_ns, self.permit).decided_by(self.decided_by)
        })
    }

    /// Denied, and no amount of waiting helps: the cost exceeds what the
    /// policy can ever admit at once.
    pub fn is_never(&self) -> bool {
        !self.allowed && self.retry_after.is_none()
    }

    /// The exact reply of redis-cell's `CL.THROTTLE`:
    /// `[limited, limit, remaining, retry_after, reset_after]`, times in whole
    /// seconds rounded up at millisecond granularity, `retry_after` −1 when
    /// allowed or never.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_throttle::Decision;
    ///
    /// let d = Decision {
    ///     allowed: false,
    ///     limit: 16,
    ///     remaining: 0,
    ///     retry_after: Some(Duration::from_millis(1999)),
    ///     reset_after: Duration::from_secs(32),
    ///     quota_after: Duration::from_millis(1999),
    ///     permit: None,
    ///     decided_by: Default::default(),
    ///     charged: 0,
    ///     charged_at_ns: 0,
    /// };
    /// assert_eq!(d.to_cell_reply(), [1, 16, 0, 2, 32]);
    /// ```
    pub fn to_cell_reply(&self) -> [i64; 5] {
        [
            i64::from(!self.allowed),
            clamp_i64(self.limit),
            clamp_i64(self.remaining),
            self.retry_after.map_or(-1, cell_seconds),
            cell_seconds(self.reset_after),
        ]
    }

    /// `retry_after` in whole seconds, rounded up and never 0, for the
    /// `Retry-After` header. `None` when allowed or never.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|d| ceil_secs(d).max(1))
    }

    /// `quota_after` in whole seconds rounded up: the IETF `t`. Never more
    /// than [`Self::retry_after_secs`] of the same denial, so a response's
    /// `Retry-After` is never earlier than its `t`.
    pub fn quota_after_secs(&self) -> u64 {
        ceil_secs(self.quota_after)
    }
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// redis-cell's rounding: whole seconds, plus one if any milliseconds remain.
fn cell_seconds(d: Duration) -> i64 {
    let ms = d.as_millis();
    clamp_i64(u64::try_from(ms / 1000 + u128::from(!ms.is_multiple_of(1000))).unwrap_or(u64::MAX))
}

/// Whole seconds rounded up at nanosecond granularity.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry: Option<Duration>, reset: Duration) -> Decision {
        Decision {
            allowed: false,
            limit: 1,
            remaining: 0,
            retry_after: retry,
            reset_after: reset,
            quota_after: retry.unwrap_or_default(),
            permit: None,
            decided_by: DecidedBy::Primary,
            charged: 0,
            charged_at_ns: 0,
        }
    }

    #[test]
    fn cell_rounding_is_at_millisecond_granularity() {
        let d = denied(
            Some(Duration::from_micros(1_000_999)),
            Duration::from_micros(999),
        );
        // 1.000999 s is 1000 ms: no extra second; 999 µs is 0 ms.
        assert_eq!(d.to_cell_reply(), [1, 1, 0, 1, 0]);
        let d = denied(Some(Duration::from_millis(1001)), Duration::from_millis(1));
        assert_eq!(d.to_cell_reply(), [1, 1, 0, 2, 1]);
        let never = denied(None, Duration::ZERO);
        assert!(never.is_never());
        assert_eq!(never.to_cell_reply()[3], -1);
    }

    #[test]
    fn retry_after_header_is_never_zero() {
        let d = denied(Some(Duration::from_nanos(1)), Duration::ZERO);
        assert_eq!(d.retry_after_secs(), Some(1));
        let d = denied(Some(Duration::from_millis(2001)), Duration::ZERO);
        assert_eq!(d.retry_after_secs(), Some(3));
    }
}
