//! One probe at a time: the gate shared by the Redis stores' breaker and
//! [`FallbackStore`](super::FallbackStore).
//!
//! Both stop sending to a store that is out, and let one caller at a time
//! find out whether it is back. [`ProbeGate`] is that mechanism and no
//! more: closed (every call goes through) or open until a clock reading
//! (no probe before it), and while open at most one probe out, held by a
//! [`ProbeGuard`]. What opens it, for how long, and what a probe's answer
//! means stay with its owner, who reports outcomes with
//! [`open`](ProbeGate::open), [`open_for`](ProbeGate::open_for) and
//! [`close`](ProbeGate::close).
//!
//! The turn to probe is given back when its guard drops, however the
//! probing call ends: answered, failed, or dropped by its caller (a client
//! disconnecting, a timeout around the call). A probe that never reports
//! cannot keep the gate to itself once its caller is gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Clock;

/// The reading [`ProbeGate::open`] opens until: a probe may go at once on a
/// clock whose readings are at least 1.
#[cfg_attr(not(feature = "redis"), allow(dead_code))] // the breaker's
const OPEN_NOW: u64 = 1;

/// Closed, or open until a reading of its owner's clock; while open, one
/// probe at a time. See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct ProbeGate {
    /// 0 while closed; else the clock reading before which no probe goes.
    /// One word, so the closed check is one load and the state never tears.
    open_until: AtomicU64,
    /// A probe is out: its [`ProbeGuard`] is alive.
    probing: AtomicBool,
}

/// What [`ProbeGate::try_probe`] answers a caller.
#[derive(Debug)]
pub(crate) enum Probe<'a> {
    /// The gate is closed: the call goes through as usual.
    Closed,
    /// Open, and not this caller's turn: the wait has not passed, or
    /// another probe is out.
    Wait,
    /// Open, and this caller is the one probe; dropping the guard gives the
    /// turn back.
    Mine(ProbeGuard<'a>),
}

impl ProbeGate {
    /// A closed gate.
    pub(crate) const fn new() -> Self {
        ProbeGate {
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// True while open (between a failure and the next success).
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// Whether the caller may call, must wait, or is the one probe. While
    /// closed this is one atomic load and `clock` is not read.
    #[inline]
    pub(crate) fn try_probe<C: Clock + ?Sized>(&self, clock: &C) -> Probe<'_> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Probe::Closed;
        }
        self.try_probe_open(until, clock)
    }

    /// [`try_probe`](Self::try_probe) on an open gate: past the wait, the one
    /// caller that flips `probing` probes. Out of line, so that the closed
    /// check inlined into every call stays a load and a branch.
    #[cold]
    #[inline(never)]
    fn try_probe_open<C: Clock + ?Sized>(&self, until: u64, clock: &C) -> Probe<'_> {
        if clock.now_ns() < until {
            return Probe::Wait;
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Probe::Mine(ProbeGuard(self)),
            Err(_) => Probe::Wait,
        }
    }

    /// Opens a closed gate with no wait: the next caller probes (on a clock
    /// whose readings are at least 1). An open gate keeps its wait. True if
    /// it was closed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the breaker's
    pub(crate) fn open(&self) -> bool {
        // A load first: while open, failures storm in and change nothing.
        self.open_until.load(Ordering::Acquire) == 0
            && self
                .open_until
                .compare_exchange(0, OPEN_NOW, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Opens the gate, or moves its wait, to `wait` from now on `clock`: no
    /// probe before then. True if it was closed.
    pub(crate) fn open_for<C: Clock + ?Sized>(&self, clock: &C, wait: Duration) -> bool {
        // Never 0, which is "closed", whatever the clock reads.
        let until = clock.now_ns().saturating_add(nanos(wait)).max(1);
        self.open_until.swap(until, Ordering::AcqRel) == 0
    }

    /// Closes the gate. True if it was open.
    pub(crate) fn close(&self) -> bool {
        // A load first: every answered call closes, and the swap is for the
        // rare one that finds the gate open.
        self.open_until.load(Ordering::Acquire) != 0
            && self.open_until.swap(0, Ordering::AcqRel) != 0
    }
}

/// The turn to probe an open [`ProbeGate`]; given back when dropped.
#[derive(Debug)]
#[must_use = "the turn to probe ends when the guard drops"]
pub(crate) struct ProbeGuard<'a>(&'a ProbeGate);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// `d` in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use super::*;
    use crate::clock::ManualClock;

    const WAIT: Duration = Duration::from_secs(1);

    fn is_wait(p: &Probe<'_>) -> bool {
        matches!(p, Probe::Wait)
    }

    #[test]
    fn a_closed_gate_lets_every_call_through() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::new());
        for _ in 0..3 {
            assert!(matches!(gate.try_probe(&clock), Probe::Closed));
        }
        assert!(!gate.is_open());
        assert!(!gate.close(), "was not open");
    }

    #[test]
    fn open_for_waits_then_lets_one_probe_through() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::new());
        assert!(gate.open_for(&clock, WAIT), "was closed");
        assert!(!gate.open_for(&clock, WAIT), "was open");
        assert!(is_wait(&gate.try_probe(&clock)));
        clock.advance(WAIT - Duration::from_nanos(1));
        assert!(is_wait(&gate.try_probe(&clock)), "not before the wait");
        clock.advance(Duration::from_nanos(1));
        let probe = gate.try_probe(&clock);
        assert!(matches!(probe, Probe::Mine(_)));
        assert!(is_wait(&gate.try_probe(&clock)), "one at a time");
        drop(probe);
    }

    #[test]
    fn open_probes_at_once_and_keeps_a_wait() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::starting_at(1));
        assert!(gate.open(), "was closed");
        assert!(matches!(gate.try_probe(&clock), Probe::Mine(_)));
        gate.open_for(&clock, WAIT);
        assert!(!gate.open(), "was open");
        assert!(is_wait(&gate.try_probe(&clock)), "the wait holds");
    }

    #[test]
    fn a_failed_probe_reopens_and_a_successful_one_closes() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::new());
        gate.open_for(&clock, WAIT);
        clock.advance(WAIT);
        let Probe::Mine(guard) = gate.try_probe(&clock) else {
            panic!("the wait passed")
        };
        assert!(!gate.open_for(&clock, WAIT), "still open");
        drop(guard);
        assert!(is_wait(&gate.try_probe(&clock)), "a new wait");
        clock.advance(WAIT);
        let Probe::Mine(guard) = gate.try_probe(&clock) else {
            panic!("the new wait passed")
        };
        assert!(gate.close(), "was open");
        drop(guard);
        assert!(matches!(gate.try_probe(&clock), Probe::Closed));
        assert!(!gate.is_open());
    }

    /// A probe whose caller is gone (its guard dropped, no outcome reported)
    /// gives the turn back: the gate is not wedged.
    #[test]
    fn a_dropped_guard_gives_the_turn_back() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::new());
        gate.open_for(&clock, Duration::ZERO);
        let first = gate.try_probe(&clock);
        assert!(matches!(first, Probe::Mine(_)));
        drop(first);
        assert!(matches!(gate.try_probe(&clock), Probe::Mine(_)));
        assert!(gate.is_open(), "no outcome: still open");
    }

    /// Many callers at once past the wait: exactly one probes, whichever
    /// thread wins. Each keeps what it got until all have asked.
    #[test]
    fn one_winner_among_concurrent_callers() {
        const THREADS: usize = 8;
        for _ in 0..200 {
            let (gate, clock) = (ProbeGate::new(), ManualClock::new());
            gate.open_for(&clock, WAIT);
            clock.advance(WAIT);
            let start = Barrier::new(THREADS);
            let got: Vec<Probe<'_>> = std::thread::scope(|s| {
                let asks: Vec<_> = (0..THREADS)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            gate.try_probe(&clock)
                        })
                    })
                    .collect();
                asks.into_iter().map(|t| t.join().unwrap()).collect()
            });
            let winners = got.iter().filter(|p| matches!(p, Probe::Mine(_))).count();
            assert_eq!(winners, 1, "{got:?}");
            assert!(got.iter().all(|p| !matches!(p, Probe::Closed)));
            drop(got);
            assert!(matches!(gate.try_probe(&clock), Probe::Mine(_)), "released");
        }
    }

    /// A loop of callers while one probe is out: none gets a turn.
    #[test]
    fn no_second_probe_while_one_is_out() {
        let (gate, clock) = (ProbeGate::new(), ManualClock::new());
        gate.open_for(&clock, Duration::ZERO);
        let _mine = gate.try_probe(&clock);
        for _ in 0..1000 {
            clock.advance(WAIT);
            assert!(is_wait(&gate.try_probe(&clock)));
        }
    }

    #[test]
    fn the_wait_saturates_and_is_never_closed() {
        let gate = ProbeGate::new();
        let late = ManualClock::starting_at(u64::MAX - 1);
        gate.open_for(&late, Duration::MAX);
        assert!(is_wait(&gate.try_probe(&late)), "until the end of time");
        let zero = ManualClock::starting_at(0);
        gate.close();
        gate.open_for(&zero, Duration::ZERO);
        assert!(gate.is_open(), "a wait ending at 0 still opens it");
    }
}
