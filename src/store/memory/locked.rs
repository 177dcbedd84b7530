//! The state of the algorithms other than GCRA (sliding log, fixed and
//! sliding window, concurrency): a [`Slot::Other`](super::slot::Slot) holds
//! it behind a per-key mutex, with the instant it is fresh again.

use crate::algorithm::concurrency::{self, ConcurrencyState};
use crate::algorithm::fixed_window::{self, FixedWindowState};
use crate::algorithm::sliding_log::{self, SlidingLogState};
use crate::algorithm::sliding_window::{self, SlidingWindowState};
use crate::decision::{Decision, PermitId, Receipt};
use crate::policy::{Algorithm, ConcurrencyParams, GcraParams, Policy, WindowParams};

pub(super) struct LockedSlot {
    state: LockedState,
    /// When `state` is back to fresh; kept here because computing it needs the policy.
    expires_at: u64,
}

/// One algorithm's state.
enum LockedState {
    Log(SlidingLogState),
    Fixed(FixedWindowState),
    Sliding(SlidingWindowState),
    Concurrency(ConcurrencyState),
}

impl LockedSlot {
    /// A fresh state for `policy`, or `None` for GCRA (which lives in a
    /// `Slot::Gcra` word, not behind a mutex).
    pub(super) fn fresh(policy: &Policy) -> Option<LockedSlot> {
        Some(LockedSlot {
            state: LockedState::fresh(policy)?,
            expires_at: 0,
        })
    }

    /// A fresh state for `policy` and the decision on it (admitted when
    /// `admit`); GCRA's parameters back for a GCRA policy, whose state is no
    /// locked one.
    pub(super) fn decide_fresh(
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: PermitId,
        admit: bool,
    ) -> Result<(LockedSlot, Decision), &GcraParams> {
        let (state, d) = match policy.algorithm() {
            Algorithm::Gcra(p) => return Err(p),
            Algorithm::SlidingLog(p) => {
                let mut s = SlidingLogState::default();
                let d = run_log(p, &mut s, now, cost, admit);
                (LockedState::Log(s), d)
            }
            Algorithm::FixedWindow(p) => {
                let mut s = FixedWindowState::default();
                let d = run_fixed(p, &mut s, now, cost, admit);
                (LockedState::Fixed(s), d)
            }
            Algorithm::SlidingWindow(p) => {
                let mut s = SlidingWindowState::default();
                let d = run_sliding(p, &mut s, now, cost, admit);
                (LockedState::Sliding(s), d)
            }
            Algorithm::Concurrency(p) => {
                let mut s = ConcurrencyState::default();
                let d = run_concurrency(p, &mut s, now, cost, permit, admit);
                (LockedState::Concurrency(s), d)
            }
        };
        let mut other = LockedSlot {
            state,
            expires_at: 0,
        };
        if admit && d.allowed && cost > 0 {
            other.refresh_expiry(policy);
        }
        Ok((other, d))
    }

    /// Whether this state is `policy`'s algorithm's.
    pub(super) fn matches(&self, policy: &Policy) -> bool {
        self.state.matches(policy)
    }

    /// When this state is back to fresh.
    pub(super) fn expires_at(&self) -> u64 {
        self.expires_at
    }

    /// Gives a charge's units back to the slot its receipt names.
    pub(super) fn refund(&mut self, policy: &Policy, now: u64, receipt: &Receipt) {
        if self.state.refund(policy, now, receipt) {
            self.refresh_expiry(policy);
        }
    }

    /// Releases one concurrency permit.
    pub(super) fn release(&mut self, policy: &Policy, permit: PermitId) {
        if let LockedState::Concurrency(s) = &mut self.state {
            concurrency::release(s, permit);
            self.refresh_expiry(policy);
        }
    }

    /// Decides (and admits when `admit`); `None` when the state belongs to
    /// another algorithm.
    pub(super) fn decide(
        &mut self,
        policy: &Policy,
        now: u64,
        cost: u64,
        permit: PermitId,
        admit: bool,
    ) -> Option<Decision> {
        let d = match (&mut self.state, policy.algorithm()) {
            (LockedState::Log(s), Algorithm::SlidingLog(p)) => run_log(p, s, now, cost, admit),
            (LockedState::Fixed(s), Algorithm::FixedWindow(p)) => run_fixed(p, s, now, cost, admit),
            (LockedState::Sliding(s), Algorithm::SlidingWindow(p)) => {
                run_sliding(p, s, now, cost, admit)
            }
            (LockedState::Concurrency(s), Algorithm::Concurrency(p)) => {
                run_concurrency(p, s, now, cost, permit, admit)
            }
            // A key held for another algorithm.
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::Concurrency(_)) => return None,
        };
        if admit && d.allowed && cost > 0 {
            self.refresh_expiry(policy);
        }
        Some(d)
    }

    fn refresh_expiry(&mut self, policy: &Policy) {
        self.expires_at = match (&self.state, policy.algorithm()) {
            (LockedState::Log(s), Algorithm::SlidingLog(p)) => sliding_log::expires_at(p, s),
            (LockedState::Fixed(s), Algorithm::FixedWindow(p)) => fixed_window::expires_at(p, s),
            (LockedState::Sliding(s), Algorithm::SlidingWindow(p)) => {
                sliding_window::expires_at(p, s)
            }
            (LockedState::Concurrency(s), Algorithm::Concurrency(_)) => concurrency::expires_at(s),
            // A key held for another algorithm: it keeps its expiry.
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::Concurrency(_)) => self.expires_at,
        };
    }
}

impl LockedState {
    /// A fresh state for `policy`'s algorithm, or `None` for GCRA (which
    /// lives in a `Slot::Gcra` word, not behind a mutex).
    fn fresh(policy: &Policy) -> Option<LockedState> {
        Some(match policy.algorithm() {
            Algorithm::Gcra(_) => return None,
            Algorithm::SlidingLog(_) => LockedState::Log(Default::default()),
            Algorithm::FixedWindow(_) => LockedState::Fixed(Default::default()),
            Algorithm::SlidingWindow(_) => LockedState::Sliding(Default::default()),
            Algorithm::Concurrency(_) => LockedState::Concurrency(Default::default()),
        })
    }

    fn matches(&self, policy: &Policy) -> bool {
        match (self, policy.algorithm()) {
            (LockedState::Log(_), Algorithm::SlidingLog(_))
            | (LockedState::Fixed(_), Algorithm::FixedWindow(_))
            | (LockedState::Sliding(_), Algorithm::SlidingWindow(_))
            | (LockedState::Concurrency(_), Algorithm::Concurrency(_)) => true,
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::Concurrency(_)) => false,
        }
    }

    /// Gives a charge's units back; false if the state is another algorithm's.
    fn refund(&mut self, policy: &Policy, now: u64, receipt: &Receipt) -> bool {
        match (self, policy.algorithm()) {
            (LockedState::Log(s), Algorithm::SlidingLog(p)) => {
                sliding_log::refund(p, s, now, receipt)
            }
            (LockedState::Fixed(s), Algorithm::FixedWindow(p)) => {
                *s = fixed_window::refund(p, s, now, receipt)
            }
            (LockedState::Sliding(s), Algorithm::SlidingWindow(p)) => {
                *s = sliding_window::refund(p, s, now, receipt)
            }
            (LockedState::Concurrency(s), Algorithm::Concurrency(_)) => {
                concurrency::refund(s, now, receipt)
            }
            (_, Algorithm::Gcra(_))
            | (_, Algorithm::SlidingLog(_))
            | (_, Algorithm::FixedWindow(_))
            | (_, Algorithm::SlidingWindow(_))
            | (_, Algorithm::Concurrency(_)) => return false,
        }
        true
    }
}

/// Decides (and admits when `admit`) on a sliding log.
fn run_log(
    p: &WindowParams,
    s: &mut SlidingLogState,
    now: u64,
    cost: u64,
    admit: bool,
) -> Decision {
    sliding_log::prune(p, s, now);
    let d = sliding_log::check(p, s, now, cost);
    if admit && d.allowed {
        sliding_log::admit(p, s, now, cost);
    }
    d
}

/// Decides (and admits when `admit`) on a fixed window.
fn run_fixed(
    p: &WindowParams,
    s: &mut FixedWindowState,
    now: u64,
    cost: u64,
    admit: bool,
) -> Decision {
    let d = fixed_window::check(p, s, now, cost);
    if admit && d.allowed {
        *s = fixed_window::admit(p, s, now, cost);
    }
    d
}

/// Decides (and admits when `admit`) on a sliding window.
fn run_sliding(
    p: &WindowParams,
    s: &mut SlidingWindowState,
    now: u64,
    cost: u64,
    admit: bool,
) -> Decision {
    let d = sliding_window::check(p, s, now, cost);
    if admit && d.allowed {
        *s = sliding_window::admit(p, s, now, cost);
    }
    d
}

/// Decides (and admits when `admit`) on a concurrency limit.
fn run_concurrency(
    p: &ConcurrencyParams,
    s: &mut ConcurrencyState,
    now: u64,
    cost: u64,
    permit: PermitId,
    admit: bool,
) -> Decision {
    concurrency::prune(s, now);
    let d = concurrency::check(p, s, now, cost, permit);
    if admit && d.allowed {
        concurrency::admit(p, s, now, cost, permit);
    }
    d
}
