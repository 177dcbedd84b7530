//! What [`Store::decide`](super::Store::decide) answers: decisions ready
//! now, or a future of them.

use std::future::{Future, IntoFuture};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;

use super::StoreError;
use crate::decision::Decision;

/// A store's answer to one check: ready at once (an in-process store, a
/// cached denial, a lease in hand) or later, through a future (a network
/// round trip). Await it for the decisions either way.
///
/// A `Later` future has not started: like every Rust future it does its
/// work when polled, so one dropped before its first poll charged nothing.
/// The layer relies on it: it settles a `Now` inline, and checks through
/// its own boxed future only when the store needs one.
#[derive(Debug)]
#[must_use = "an answer holds the decisions, or the future that makes them"]
pub enum Answer<F> {
    /// Decided already.
    Now(Result<Decisions, StoreError>),
    /// Decided when this future completes.
    Later(F),
}

/// A later answer's future, boxed: a store that answers both at once and
/// later returns this, so that an answer given at once moves no more than
/// its decisions (an `Answer` is as large as its future, and a store's
/// future of a network call is kilobytes).
pub type LaterBox<'a> = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send + 'a>>;

impl<'a> Answer<LaterBox<'a>> {
    /// An answer to come from `future`, boxed (see [`LaterBox`]).
    pub fn later(future: impl Future<Output = Result<Decisions, StoreError>> + Send + 'a) -> Self {
        Answer::Later(Box::pin(future))
    }
}

impl<F> Answer<F> {
    /// The decisions when they were given at once; `None` for a future,
    /// dropped here unpolled (so nothing was charged).
    #[inline]
    pub fn ready(self) -> Option<Result<Decisions, StoreError>> {
        match self {
            Answer::Now(result) => Some(result),
            Answer::Later(_) => None,
        }
    }
}

impl<F: Future<Output = Result<Decisions, StoreError>>> IntoFuture for Answer<F> {
    type Output = Result<Decisions, StoreError>;
    type IntoFuture = AnswerFuture<F>;

    fn into_future(self) -> AnswerFuture<F> {
        let state = match self {
            Answer::Now(result) => State::Now {
                result: Some(result),
            },
            Answer::Later(future) => State::Later { future },
        };
        AnswerFuture { state }
    }
}

/// How a caller reaches the store: the layer checks in process first
/// ([`Reach::Now`]), and through the store's futures only when it must.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// In process: each call answers at once, or not at all (the caller then
    /// goes on through [`Reach::Later`]); nothing waits.
    Now,
    /// Through the store's futures, waiting where the mode says.
    Later,
}

impl Reach {
    /// A store's answer as this reach takes it: [`Reach::Now`] reads an
    /// answer given at once and leaves a future unpolled (`None`: nothing
    /// was charged); [`Reach::Later`] awaits it.
    pub(crate) async fn answer<F>(self, answer: Answer<F>) -> Option<Result<Decisions, StoreError>>
    where
        F: Future<Output = Result<Decisions, StoreError>>,
    {
        match (answer, self) {
            (Answer::Now(result), _) => Some(result),
            (Answer::Later(_), Reach::Now) => None,
            (Answer::Later(future), Reach::Later) => Some(future.await),
        }
    }

    /// Work that owns what it needs (a lock-out's strikes): awaited
    /// [`Reach::Later`]; [`Reach::Now`] polls it once and, if it must wait,
    /// lets it finish in the background (`None`).
    pub(crate) async fn finish<F>(self, mut work: Pin<Box<F>>) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send,
    {
        if self == Reach::Later {
            return Some(work.await);
        }
        match work.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => {
                release_detached(async move {
                    work.await;
                });
                None
            }
        }
    }
}

/// Runs `fut` to completion without awaiting it: inline if it finishes on the
/// first poll (memory store), else on the current tokio runtime if any.
pub(crate) fn release_detached<F: Future<Output = ()> + Send + 'static>(fut: F) {
    let mut fut = Box::pin(fut);
    let mut cx = Context::from_waker(Waker::noop());
    if fut.as_mut().poll(&mut cx).is_pending() {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(fut);
        }
    }
}

pin_project! {
    /// An [`Answer`] awaited: its decisions at the first poll when they are
    /// ready, or its future's. No larger than the future itself.
    #[must_use = "futures do nothing unless polled"]
    pub struct AnswerFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Now { result: Option<Result<Decisions, StoreError>> },
        Later { #[pin] future: F },
    }
}

impl<F: Future<Output = Result<Decisions, StoreError>>> Future for AnswerFuture<F> {
    type Output = Result<Decisions, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Now { result } => {
                Poll::Ready(result.take().expect("an answer polled after it was given"))
            }
            StateProj::Later { future } => future.poll(cx),
        }
    }
}

/// One decision per charge of a check, in the charges' order, without an
/// allocation for the common check of one charge. Reads as a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decisions(Held);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Held {
    One(Decision),
    Many(Vec<Decision>),
}

impl Decisions {
    /// The decision of a check of one charge.
    pub fn one(decision: Decision) -> Self {
        Decisions(Held::One(decision))
    }

    /// The decision of the only charge; an error (a store's defect) when
    /// there are other than one.
    #[inline]
    pub fn into_one(self) -> Result<Decision, StoreError> {
        match self.0 {
            Held::One(d) => Ok(d),
            Held::Many(mut v) if v.len() == 1 => Ok(v.remove(0)),
            Held::Many(v) => Err(not_one(v.len())),
        }
    }

    /// Every decision, in order.
    pub fn into_vec(self) -> Vec<Decision> {
        match self.0 {
            Held::One(d) => vec![d],
            Held::Many(v) => v,
        }
    }
}

#[cold]
fn not_one(n: usize) -> StoreError {
    StoreError::Protocol(format!("{n} decisions answered a check of one charge"))
}

impl From<Vec<Decision>> for Decisions {
    fn from(decisions: Vec<Decision>) -> Self {
        Decisions(Held::Many(decisions))
    }
}

impl From<Decision> for Decisions {
    fn from(decision: Decision) -> Self {
        Decisions::one(decision)
    }
}

impl Deref for Decisions {
    type Target = [Decision];

    #[inline]
    fn deref(&self) -> &[Decision] {
        match &self.0 {
            Held::One(d) => std::slice::from_ref(d),
            Held::Many(v) => v,
        }
    }
}

impl DerefMut for Decisions {
    fn deref_mut(&mut self) -> &mut [Decision] {
        match &mut self.0 {
            Held::One(d) => std::slice::from_mut(d),
            Held::Many(v) => v,
        }
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = std::vec::IntoIter<Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The tests' view of [`Answer::ready`]: one store call, answered at once
/// or not at all.
#[cfg(test)]
pub(crate) trait AtOnce {
    /// The decision of `charge` when the store gives it at once.
    fn at_once(&self, charge: super::Charge<'_>) -> Option<Result<Decision, StoreError>>;
    /// The decisions of `charges` when the store gives them at once.
    fn all_at_once(&self, charges: &[super::Charge<'_>]) -> Option<Result<Decisions, StoreError>>;
}

#[cfg(test)]
impl<S: super::Store> AtOnce for S {
    fn at_once(&self, charge: super::Charge<'_>) -> Option<Result<Decision, StoreError>> {
        let ready = self.decide(&[charge]).ready();
        ready.map(|r| r.and_then(Decisions::into_one))
    }

    fn all_at_once(&self, charges: &[super::Charge<'_>]) -> Option<Result<Decisions, StoreError>> {
        self.decide(charges).ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{DecidedBy, Decision};
    use std::time::Duration;

    fn admitted(remaining: u64) -> Decision {
        Decision {
            allowed: true,
            limit: 5,
            remaining,
            retry_after: None,
            reset_after: Duration::from_secs(1),
            quota_after: Duration::ZERO,
            permit: None,
            decided_by: DecidedBy::Primary,
            charged: 1,
            charged_at_ns: 0,
        }
    }

    #[test]
    fn one_decision_reads_as_a_slice_of_one_and_comes_back_out() {
        let one = Decisions::one(admitted(4));
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].remaining, 4);
        assert_eq!(one.clone().into_vec(), vec![admitted(4)]);
        assert_eq!(one.into_one().unwrap(), admitted(4));
    }

    #[test]
    fn other_than_one_decision_is_a_protocol_error_for_one_charge() {
        assert!(Decisions::from(vec![]).into_one().is_err());
        let two = Decisions::from(vec![admitted(1), admitted(2)]);
        assert_eq!(two.iter().map(|d| d.remaining).collect::<Vec<_>>(), [1, 2]);
        assert!(matches!(two.into_one(), Err(StoreError::Protocol(_))));
        assert_eq!(
            Decisions::from(vec![admitted(3)]).into_one().unwrap(),
            admitted(3)
        );
    }
}
