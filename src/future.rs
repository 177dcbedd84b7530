//! The response future of [`Throttle`](crate::Throttle).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::{Guard, ThrottleBody};
use crate::check::{Carried, Verdict};
use crate::info::RateLimitInfo;
use crate::response::add_headers;
use crate::settings::Forwarding;
use crate::store::Store;
use crate::upgrade::{is_upgrade, upgraded, UpgradePermit};

/// A check still waiting for the store (or for the quota, in delay mode).
pub(crate) type BoxCheck<St> = Pin<Box<dyn Future<Output = Verdict<St>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own.
    pub struct ResponseFuture<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        #[pin]
        state: Phase<S, ReqB, St>,
    }
}

pin_project! {
    #[project = PhaseProj]
    enum Phase<S, ReqB, St>
    where
        S: Service<Request<ReqB>>,
        St: Store,
    {
        // Boxed: only stores that answer asynchronously get here, and the
        // request would otherwise make every response future a copy of it.
        Checking {
            pending: Option<Box<Pending<S, ReqB, St>>>,
        },
        // What an admission carries and a rejection are boxed too: the
        // future stays small enough to move without a `memcpy` call.
        Calling {
            #[pin]
            future: S::Future,
            carried: Option<Box<Carried<St>>>,
        },
        Done {
            response: Option<Box<Response<Bytes>>>,
        },
    }
}

/// A request waiting for its check, with the service that will take it.
pub(crate) struct Pending<S, ReqB, St: Store> {
    check: BoxCheck<St>,
    service: S,
    request: Request<ReqB>,
    forwarding: Forwarding,
}

impl<S, ReqB, St> ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    pub(crate) fn checking(
        check: BoxCheck<St>,
        service: S,
        request: Request<ReqB>,
        forwarding: Forwarding,
    ) -> Self {
        ResponseFuture {
            state: Phase::Checking {
                pending: Some(Box::new(Pending {
                    check,
                    service,
                    request,
                    forwarding,
                })),
            },
        }
    }

    /// The inner service's call, with nothing to add to its response.
    pub(crate) fn forwarded(future: S::Future) -> Self {
        ResponseFuture {
            state: Phase::Calling {
                future,
                carried: None,
            },
        }
    }

    /// The layer's own answer.
    pub(crate) fn rejected(response: Box<Response<Bytes>>) -> Self {
        ResponseFuture {
            state: Phase::Done {
                response: Some(response),
            },
        }
    }

    /// Acts on a finished check: calls `service` (which must be ready) or
    /// answers directly.
    pub(crate) fn decided(
        verdict: Verdict<St>,
        service: &mut S,
        request: Request<ReqB>,
        forwarding: Forwarding,
    ) -> Self {
        ResponseFuture {
            state: Phase::decided(verdict, service, request, forwarding),
        }
    }
}

impl<S, ReqB, St> Phase<S, ReqB, St>
where
    S: Service<Request<ReqB>>,
    St: Store,
{
    fn decided(
        verdict: Verdict<St>,
        service: &mut S,
        mut request: Request<ReqB>,
        forwarding: Forwarding,
    ) -> Self {
        match verdict {
            Verdict::Reject(response) => Phase::Done {
                response: Some(response),
            },
            Verdict::Forward(None) => Phase::Calling {
                future: service.call(request),
                carried: None,
            },
            Verdict::Forward(Some(mut carried)) => {
                if let Some(info) = carried.info.take() {
                    // An unchecked request's response gets no fields.
                    if forwarding.headers && info.is_limited() {
                        carried.headers = Some(info.clone());
                    }
                    // An outer layer's decisions say more than "not checked".
                    let outer = || request.extensions().get::<RateLimitInfo>().is_some();
                    if forwarding.request_info && (info.is_limited() || !outer()) {
                        request.extensions_mut().insert(info);
                    }
                }
                if let Some(permits) = carried.permits.take_if(|_| is_upgrade(&request)) {
                    let offer = UpgradePermit::new(Guard::new(permits));
                    request.extensions_mut().insert(offer.clone());
                    let connect = request.method() == http::Method::CONNECT;
                    carried.upgrade = Some((offer, connect));
                }
                Phase::Calling {
                    future: service.call(request),
                    carried: carried.needed().then_some(carried),
                }
            }
        }
    }
}

impl<S, ReqB, ResB, St> Future for ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    St: Store,
{
    type Output = Result<Response<ThrottleBody<ResB>>, S::Error>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The common case, an admission with nothing carried: the inner
        // response goes straight out, with as few moves as the compiler
        // can manage; every other phase is out of line.
        if let PhaseProj::Calling {
            future,
            carried: None,
        } = self.as_mut().project().state.project()
        {
            return future
                .poll(cx)
                .map(|result| result.map(|response| response.map(ThrottleBody::inner)));
        }
        self.poll_phases(cx)
    }
}

impl<S, ReqB, ResB, St> ResponseFuture<S, ReqB, St>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    St: Store,
{
    /// Every other phase: a check still running, an admission carrying
    /// headers, permits or a charge, or the layer's own answer.
    #[inline(never)]
    fn poll_phases(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<ThrottleBody<ResB>>, S::Error>> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                PhaseProj::Checking { pending } => {
                    let waiting = pending
                        .as_mut()
                        .expect("ResponseFuture polled after completion");
                    let verdict = ready!(waiting.check.as_mut().poll(cx));
                    let Some(pending) = pending.take() else {
                        unreachable!("checked above");
                    };
                    let Pending {
                        mut service,
                        request,
                        forwarding,
                        ..
                    } = *pending;
                    let next = Phase::decided(verdict, &mut service, request, forwarding);
                    this.state.set(next);
                }
                PhaseProj::Calling { future, carried } => {
                    let result = ready!(future.poll(cx));
                    let Some(carried) = carried.take() else {
                        return Poll::Ready(result.map(|r| r.map(ThrottleBody::inner)));
                    };
                    let Carried {
                        headers,
                        permits,
                        upgrade,
                        charge,
                        ..
                    } = *carried;
                    // What only the body tells (trailers, bytes) waits for it.
                    let charge = charge.and_then(|charge| charge.at_head(&result));
                    // Concurrency permits stay held until the response body
                    // ends (or is dropped), or now if the inner service failed;
                    // those of an upgrade, if its handler claimed them, until
                    // the handler's upgraded task drops them.
                    let mut guard = permits.map(Guard::new);
                    if let (Some((offer, connect)), Ok(response)) = (&upgrade, &result) {
                        guard = offer.unclaimed(upgraded(*connect, response.status()));
                    }
                    return Poll::Ready(result.map(|response| {
                        let mut response =
                            response.map(|body| ThrottleBody::inner_holding(body, guard, charge));
                        if let Some(info) = headers {
                            add_headers(response.headers_mut(), &info);
                        }
                        response
                    }));
                }
                PhaseProj::Done { response } => {
                    let response = response
                        .take()
                        .expect("ResponseFuture polled after completion");
                    return Poll::Ready(Ok((*response).map(ThrottleBody::full)));
                }
            }
        }
    }
}
