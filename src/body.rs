//! The response body: the inner service's, or the layer's own message.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a [`Throttle`](crate::Throttle) response: the inner
    /// service's body untouched, or the layer's own rejection message.
    ///
    /// It has the inner body's `Data` type (which must be buildable from
    /// [`Bytes`], as axum's and hyper's are), so the layer works over any body
    /// without boxing it. The inner body alone is kept inline; anything else
    /// (held permits, the layer's own message) is boxed, so that for a body
    /// with room for a pointer beside its niche (axum's `Body`) the wrapper
    /// costs no bytes. When the request holds concurrency permits, the
    /// body holds them until it has been read to the end (or dropped): a
    /// streamed download counts as in flight until its last byte. A gRPC
    /// call counted by [`count_if`](crate::ThrottleLayer::count_if) is
    /// settled when its trailers (and their `grpc-status`) go through, and a
    /// cost settled after the response ([`crate::meter`]) when the body ends.
    #[derive(Debug)]
    pub struct ThrottleBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    // The inner body alone is as small as the inner body (the rest is boxed,
    // and a box fits beside the inner body's own niche): a response moves in
    // as few bytes as the inner service's.
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Boxed { other: Pin<Box<BoxedBody<B>>> },
    }
}

pin_project! {
    #[project = BoxedBodyProj]
    #[derive(Debug)]
    enum BoxedBody<B> {
        Held { #[pin] body: B, guard: Option<Guard>, charge: Option<BodySettle> },
        Full { data: Option<Bytes> },
    }
}

/// Something held until the body ends (the request's concurrency permits).
pub(crate) struct Guard(#[allow(dead_code)] Box<dyn Send + Sync>);

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guard")
    }
}

impl Guard {
    pub(crate) fn new(held: impl Send + Sync + 'static) -> Self {
        Guard(Box::new(held))
    }
}

/// What the body tells a charge still to settle once it ends: a gRPC
/// call's `grpc-status` in its trailers (see
/// [`count_if`](crate::ThrottleLayer::count_if)), the bytes a response sent
/// or a cost in its trailers (see [`crate::meter`]).
pub(crate) struct BodySettle {
    settle: Option<SettleFn>,
    /// Data bytes gone out so far.
    bytes: u64,
}

type SettleFn = Box<dyn FnOnce(BodyEnd<'_>) + Send + Sync>;

/// How a response body ended, for [`BodySettle`].
pub(crate) struct BodyEnd<'a> {
    /// Its trailers, if it ended with them.
    pub(crate) trailers: Option<&'a HeaderMap>,
    /// The data bytes it sent.
    pub(crate) bytes: u64,
}

impl std::fmt::Debug for BodySettle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodySettle")
    }
}

impl BodySettle {
    /// `settle` is called once: at the trailers, at the end of the body, or
    /// when the body fails or is dropped (with the bytes sent until then).
    pub(crate) fn new(settle: impl FnOnce(BodyEnd<'_>) + Send + Sync + 'static) -> Self {
        BodySettle {
            settle: Some(Box::new(settle)),
            bytes: 0,
        }
    }

    fn end(&mut self, trailers: Option<&HeaderMap>) {
        if let Some(settle) = self.settle.take() {
            settle(BodyEnd {
                trailers,
                bytes: self.bytes,
            });
        }
    }
}

impl Drop for BodySettle {
    fn drop(&mut self) {
        self.end(None);
    }
}

impl<B> ThrottleBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        ThrottleBody {
            kind: Kind::Inner { body },
        }
    }

    /// Wraps the inner service's body, holding `guard` until it ends and
    /// `charge` until it ends, fails or is dropped.
    pub(crate) fn inner_holding(body: B, guard: Option<Guard>, charge: Option<BodySettle>) -> Self {
        let kind = match (guard, charge) {
            (None, None) => Kind::Inner { body },
            (guard, charge) => Kind::Boxed {
                other: Box::pin(BoxedBody::Held {
                    body,
                    guard,
                    charge,
                }),
            },
        };
        ThrottleBody { kind }
    }

    /// A body of the layer's own.
    pub fn full(data: Bytes) -> Self {
        ThrottleBody {
            kind: Kind::Boxed {
                other: Box::pin(BoxedBody::Full {
                    data: (!data.is_empty()).then_some(data),
                }),
            },
        }
    }
}

impl<B> Body for ThrottleBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Boxed { other } => match other.as_mut().project() {
                BoxedBodyProj::Held {
                    body,
                    guard,
                    charge,
                } => {
                    let frame = body.poll_frame(cx);
                    match &frame {
                        // Settled before the trailers go out: a client that
                        // has read them sees the refund done (in-process).
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Some(charge) = charge.as_mut() {
                                if let Some(data) = frame.data_ref() {
                                    charge.bytes =
                                        charge.bytes.saturating_add(data.remaining() as u64);
                                } else if let Some(trailers) = frame.trailers_ref() {
                                    charge.end(Some(trailers));
                                }
                            }
                        }
                        // The end of the body (or its failure) ends the
                        // request's hold, and settles what waited for it.
                        Poll::Ready(None | Some(Err(_))) => {
                            guard.take();
                            charge.take();
                        }
                        Poll::Pending => {}
                    }
                    frame
                }
                BoxedBodyProj::Full { data } => {
                    Poll::Ready(data.take().map(|d| Ok(Frame::data(d.into()))))
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Boxed { other } => match &**other {
                BoxedBody::Held { body, .. } => body.is_end_stream(),
                BoxedBody::Full { data } => data.is_none(),
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Boxed { other } => match &**other {
                BoxedBody::Held { body, .. } => body.size_hint(),
                BoxedBody::Full { data } => {
                    SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_axum_body_costs_no_bytes() {
        // What moves with every response: the wrapper must not make axum's
        // response bigger (a bigger one is copied with a `memcpy` call).
        assert_eq!(
            std::mem::size_of::<ThrottleBody<axum::body::Body>>(),
            std::mem::size_of::<axum::body::Body>()
        );
        assert_eq!(
            std::mem::size_of::<http::Response<ThrottleBody<axum::body::Body>>>(),
            std::mem::size_of::<http::Response<axum::body::Body>>()
        );
    }

    #[test]
    fn a_full_body_yields_its_bytes_once() {
        let body = ThrottleBody::<axum::body::Body>::full(Bytes::from_static(b"slow down"));
        assert_eq!(body.size_hint().exact(), Some(9));
        assert!(!body.is_end_stream());
        let mut body = std::pin::pin!(body);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let Poll::Ready(Some(Ok(frame))) = body.as_mut().poll_frame(&mut cx) else {
            panic!("no data frame");
        };
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"slow down"));
        assert!(body.is_end_stream());
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(None)
        ));
    }
}
