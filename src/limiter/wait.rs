//! The one budget of a wait, for `Limiter::wait_n` and the layer's delay
//! mode alike: how long and how many more times a denied check may wait
//! before it is answered as it stands.

use std::pin::Pin;
use std::time::Duration;

use tokio::sync::futures::Notified;

use super::MAX_DELAY_ATTEMPTS;

/// The shortest pause: tokio's timers tick in milliseconds, and a denial
/// that says "now" must not spin.
const MIN_PAUSE: Duration = Duration::from_millis(1);

/// What a wait has spent of `max_wait` and of [`MAX_DELAY_ATTEMPTS`].
#[derive(Debug)]
pub(crate) struct WaitBudget {
    max_wait: Duration,
    waited: Duration,
    attempts: u32,
}

/// The pause before a denied check is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pause {
    /// How long, at most.
    pub(crate) wait: Duration,
    /// Whether a release of a permit of this layer ends it sooner.
    pub(crate) on_release: bool,
}

impl WaitBudget {
    /// A wait of at most `max_wait`.
    pub(crate) fn new(max_wait: Duration) -> Self {
        WaitBudget {
            max_wait,
            waited: Duration::ZERO,
            attempts: 0,
        }
    }

    /// The time left.
    pub(crate) fn left(&self) -> Duration {
        self.max_wait.saturating_sub(self.waited)
    }

    /// The pause after a denial whose quota may be there in `retry` (`None`:
    /// never), or `None` when the wait is over: it must fit in the time left
    /// and in the attempts left. When a release may come first (only
    /// concurrency limits deny: `on_release`), the pause is whatever time is
    /// left, up to `retry`.
    pub(crate) fn pause(&self, retry: Option<Duration>, on_release: bool) -> Option<Pause> {
        let wait = retry.filter(|_| self.attempts < MAX_DELAY_ATTEMPTS)?;
        let left = self.left();
        if on_release && !left.is_zero() {
            return Some(Pause {
                wait: wait.min(left),
                on_release: true,
            });
        }
        (wait <= left).then_some(Pause {
            wait,
            on_release: false,
        })
    }

    /// Waits out `pause` and counts it: a sleep, or until `released` (armed
    /// before the check, so that a release between the check and the wait
    /// still ends it). Only the timeouts count as attempts: each wake-up is
    /// a permit freed, so they are as many as the releases.
    pub(crate) async fn take(&mut self, pause: Pause, released: Option<Pin<&mut Notified<'_>>>) {
        match released.filter(|_| pause.on_release) {
            Some(released) => {
                let started = tokio::time::Instant::now();
                if tokio::time::timeout(pause.wait, released).await.is_err() {
                    self.attempts += 1;
                }
                self.waited += started.elapsed();
            }
            None => {
                self.attempts += 1;
                let wait = pause.wait.max(MIN_PAUSE);
                tokio::time::sleep(wait).await;
                self.waited += wait;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_pause_fits_in_the_time_and_the_attempts_left() {
        let budget = WaitBudget::new(10 * MS);
        let sleep = |ms: u32| Pause {
            wait: MS * ms,
            on_release: false,
        };
        assert_eq!(budget.pause(Some(10 * MS), false), Some(sleep(10)));
        assert_eq!(budget.pause(Some(Duration::ZERO), false), Some(sleep(0)));
        assert_eq!(
            budget.pause(Some(10 * MS + Duration::from_nanos(1)), false),
            None
        );
        assert_eq!(budget.pause(None, false), None, "denied for ever");
        // A release may come first: the time left, up to the estimate.
        let release = |ms: u32| Pause {
            wait: MS * ms,
            on_release: true,
        };
        assert_eq!(budget.pause(Some(60 * MS), true), Some(release(10)));
        assert_eq!(budget.pause(Some(3 * MS), true), Some(release(3)));
        assert_eq!(WaitBudget::new(Duration::ZERO).pause(Some(MS), true), None);
        assert_eq!(
            WaitBudget::new(Duration::ZERO).pause(Some(Duration::ZERO), false),
            Some(sleep(0))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_count_at_least_a_millisecond_and_the_attempts_run_out() {
        let mut budget = WaitBudget::new(Duration::from_secs(1));
        let started = tokio::time::Instant::now();
        for _ in 0..MAX_DELAY_ATTEMPTS {
            let pause = budget.pause(Some(Duration::ZERO), false).unwrap();
            budget.take(pause, None).await;
        }
        let spent = MS * MAX_DELAY_ATTEMPTS;
        assert_eq!(budget.left(), Duration::from_secs(1) - spent);
        assert_eq!(started.elapsed(), spent);
        assert_eq!(budget.pause(Some(Duration::ZERO), false), None);
        assert_eq!(budget.pause(Some(MS), true), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_ends_a_pause_without_counting_an_attempt() {
        let notify = tokio::sync::Notify::new();
        let mut budget = WaitBudget::new(Duration::from_secs(1));
        let pause = budget.pause(Some(Duration::from_secs(5)), true).unwrap();
        let mut released = std::pin::pin!(notify.notified());
        released.as_mut().enable();
        notify.notify_waiters();
        budget.take(pause, Some(released)).await;
        assert_eq!(budget.left(), Duration::from_secs(1), "woken at once");
        // Without a release it times out, and that counts.
        for _ in 0..MAX_DELAY_ATTEMPTS {
            let pause = budget.pause(Some(MS), true).unwrap();
            let released = std::pin::pin!(notify.notified());
            budget.take(pause, Some(released)).await;
        }
        assert_eq!(budget.pause(Some(MS), true), None);
    }
}
