//! The response body: the inner service's, or the layer's own message.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a [`Throttle`](crate::Throttle) response: the inner
    /// service's body untouched, or the layer's own rejection message.
    ///
    /// It has the inner body's `Data` type (which must be buildable from
    /// [`Bytes`], as axum's and hyper's are), so the layer needs no boxing and
    /// works over any body.
    #[derive(Debug)]
    pub struct ThrottleBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ThrottleBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        ThrottleBody {
            kind: Kind::Inner { body },
        }
    }

    /// A body of the layer's own.
    pub fn full(data: Bytes) -> Self {
        ThrottleBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
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
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d.into())))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
