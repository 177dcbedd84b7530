//! The middleware service.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use crate::body::ThrottleBody;
use crate::check::{self, LayerState, Plan, Verdict};
use crate::future::{BoxCheck, ResponseFuture};
use crate::key::RequestHead;
use crate::store::Store;

/// Rate-limits the requests of an inner service; built by
/// [`ThrottleLayer`](crate::ThrottleLayer).
///
/// Clones share the layer's configuration and store, so every connection
/// sees the same counters. A rejected request never reaches the inner service.
pub struct Throttle<S, St> {
    inner: S,
    shared: Arc<LayerState<St>>,
}

impl<S, St> Throttle<S, St> {
    pub(crate) fn new(inner: S, shared: Arc<LayerState<St>>) -> Self {
        Throttle { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, St> Clone for Throttle<S, St> {
    fn clone(&self) -> Self {
        Throttle {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Throttle<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("inner", &self.inner)
            .field("rules", &self.shared.meta.rules.len())
            .finish_non_exhaustive()
    }
}

impl<S, St, ReqB, ResB> Service<Request<ReqB>> for Throttle<S, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
    St: Store,
    ResB: Body,
    ResB::Data: From<Bytes>,
{
    type Response = Response<ThrottleBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqB, St>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // Kept small enough to inline into the caller, so the request moves
        // once, straight into the inner call; everything else is out of line.
        match check::now(&self.shared, &RequestHead::new(&request)) {
            ControlFlow::Break(Verdict::Forward(None)) => {
                ResponseFuture::forwarded(self.inner.call(request))
            }
            // Dropped where it is: passing the request on is a copy of it.
            ControlFlow::Break(Verdict::Reject(response)) => ResponseFuture::rejected(response),
            checked => self.call_slow(checked, request),
        }
    }
}

impl<S, St> Throttle<S, St> {
    /// Every request that is not simply forwarded: rejections, admissions
    /// that carry information forward, checks that need a future.
    #[inline(never)]
    fn call_slow<ReqB, ResB>(
        &mut self,
        checked: ControlFlow<Verdict<St>, Plan>,
        request: Request<ReqB>,
    ) -> ResponseFuture<S, ReqB, St>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>> + Clone,
        St: Store,
    {
        let forwarding = self.shared.settings.forwarding();
        let plan = match checked {
            ControlFlow::Break(verdict) => {
                return ResponseFuture::decided(verdict, &mut self.inner, request, forwarding)
            }
            ControlFlow::Continue(plan) => plan,
        };
        // In which protocol a rejection is answered.
        let reply = self.shared.settings.protocol.reply(request.headers());
        let mut check: BoxCheck<St> = Box::pin(check::later(self.shared.clone(), plan, reply));
        // Most checks (the memory store) finish at once: then the ready inner
        // service is called here, without cloning it. Polling with a no-op
        // waker is sound: a pending future is polled again with the real
        // waker, and every future re-registers the latest waker.
        match check.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(verdict) => {
                ResponseFuture::decided(verdict, &mut self.inner, request, forwarding)
            }
            Poll::Pending => {
                // The ready service goes with the request; keep a fresh clone.
                let clone = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::checking(check, ready, request, forwarding)
            }
        }
    }
}
