//! The pauses: upstream's reconnect backoff (`jpillora/backoff`, which it
//! builds with `Min` = `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`, `Max` =
//! `XDS_CLIENT_BACKOFF_MAX_INTERVAL`, `Factor` =
//! `XDS_CLIENT_BACKOFF_RANDOM_FACTOR`, `Jitter` = `XDS_CLIENT_BACKOFF_JITTER`,
//! and never resets), and a linear pause with jitter between attempts to
//! connect.
//!
//! `jpillora/backoff` multiplies by the factor each attempt: with
//! upstream's default factor of 0.5 every pause is the initial interval;
//! with a factor above 1 the pause grows from it to the maximum (with
//! jitter, uniform between the initial interval and that).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::settings::XdsBackoff;

/// A number in [0, 1): std's per-instance random hash keys suffice for
/// jitter.
pub fn random() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// `base` ± `fraction` (grpc-middleware's `BackoffLinearWithJitter`).
pub fn jittered(base: Duration, fraction: f64) -> Duration {
    let m = 1.0 + fraction * (random() * 2.0 - 1.0);
    base.mul_f64(m.max(0.0))
}

/// `jpillora/backoff`'s `Backoff`.
pub struct Backoff {
    settings: XdsBackoff,
    attempt: u32,
}

impl Backoff {
    /// At attempt 0.
    pub fn new(settings: XdsBackoff) -> Backoff {
        Backoff {
            settings,
            attempt: 0,
        }
    }

    /// The next pause (`Duration()`: this attempt's, then the next one).
    pub fn duration(&mut self) -> Duration {
        let d = self.for_attempt(f64::from(self.attempt), random());
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// `ForAttempt`, with `r` the random number in [0, 1).
    fn for_attempt(&self, attempt: f64, r: f64) -> Duration {
        let s = self.settings;
        let min = if s.initial.is_zero() {
            Duration::from_millis(100)
        } else {
            s.initial
        };
        let max = if s.max.is_zero() {
            Duration::from_secs(10)
        } else {
            s.max
        };
        if min >= max {
            return max;
        }
        let factor = if s.factor <= 0.0 { 2.0 } else { s.factor };
        let minf = min.as_nanos() as f64;
        let mut durf = minf * factor.powf(attempt);
        if s.jitter {
            durf = r * (durf - minf) + minf;
        }
        if !durf.is_finite() || durf > (i64::MAX - 512) as f64 {
            return max;
        }
        Duration::from_nanos(durf.max(0.0) as u64).clamp(min, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(factor: f64, jitter: bool) -> Backoff {
        Backoff::new(XdsBackoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor,
            jitter,
        })
    }

    #[test]
    fn upstreams_default_factor_always_waits_the_initial_interval() {
        for attempt in 0..10 {
            for r in [0.0, 0.5, 0.99] {
                assert_eq!(
                    b(0.5, true).for_attempt(attempt.into(), r),
                    Duration::from_secs(10)
                );
            }
        }
    }

    #[test]
    fn a_factor_above_one_grows_to_the_maximum() {
        let x = b(2.0, false);
        let secs = |a: f64| x.for_attempt(a, 0.0).as_secs();
        assert_eq!(
            [secs(0.0), secs(1.0), secs(2.0), secs(3.0), secs(9.0)],
            [10, 20, 40, 60, 60]
        );
        // Jitter: uniform between the initial interval and that.
        assert_eq!(b(2.0, true).for_attempt(2.0, 0.5).as_secs(), 25);
        // Factor 0 is jpillora's default of 2.
        assert_eq!(b(0.0, false).for_attempt(1.0, 0.0).as_secs(), 20);
        let mut same = Backoff::new(XdsBackoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(5),
            factor: 2.0,
            jitter: true,
        });
        assert_eq!(same.duration(), Duration::from_secs(5));
    }

    #[test]
    fn jitter_stays_in_bounds() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(2), 0.5);
            assert!(
                d >= Duration::from_secs(1) && d <= Duration::from_secs(3),
                "{d:?}"
            );
        }
    }
}
