//! `GRPC_MAX_CONNECTION_AGE_GRACE`: a connection past its age and its grace
//! is closed, as grpc-go (upstream) closes it.
//!
//! tonic sends the GOAWAY at `max_connection_age` only when no grace is
//! set: with one, it waits out age and grace and then drops the connection
//! without a GOAWAY. So tonic gets the age alone, and this wrapper ends the
//! connection's I/O once age and grace have passed since it was accepted:
//! a client still holding a call open then loses it, as with upstream.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

/// A connection that fails its reads and writes from `age + grace` after
/// it was accepted (never, without an end).
pub(super) struct Aged<T> {
    io: T,
    end: Option<Pin<Box<Sleep>>>,
}

impl<T> Aged<T> {
    /// `io`, accepted now, ending after `life` (`None`: never).
    pub(super) fn new(io: T, life: Option<Duration>) -> Self {
        Aged {
            io,
            end: life.map(|d| Box::pin(tokio::time::sleep(d))),
        }
    }

    /// An error once the connection's life is over (and a wake-up then).
    fn ended(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let end = self.end.as_mut()?;
        end.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "GRPC_MAX_CONNECTION_AGE and its grace have passed",
            )
        })
    }
}

/// Wraps each connection an incoming stream accepts, to end after `life`.
pub(super) fn aging<T>(
    life: Option<Duration>,
) -> impl FnMut(io::Result<T>) -> io::Result<Aged<T>> + Send + 'static {
    move |io| io.map(|io| Aged::new(io, life))
}

/// How long a connection lives: age plus grace, or for ever when either is
/// zero (grpc-go's "infinity").
pub(super) fn life(age: Duration, grace: Duration) -> Option<Duration> {
    (!age.is_zero() && !grace.is_zero()).then(|| age.saturating_add(grace))
}

impl<T: AsyncRead + Unpin> AsyncRead for Aged<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(ended) = self.ended(cx) {
            return Poll::Ready(Err(ended));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Aged<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(ended) = self.ended(cx) {
            return Poll::Ready(Err(ended));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Aged<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lives_age_plus_grace_unless_either_is_zero() {
        let s = Duration::from_secs;
        assert_eq!(life(s(86_400), s(3_600)), Some(s(90_000)));
        assert_eq!(
            life(Duration::from_nanos(1), Duration::from_nanos(1)),
            Some(Duration::from_nanos(2))
        );
        assert_eq!(life(Duration::ZERO, s(3_600)), None);
        assert_eq!(life(s(86_400), Duration::ZERO), None);
        assert_eq!(life(Duration::MAX, Duration::MAX), Some(Duration::MAX));
    }
}
