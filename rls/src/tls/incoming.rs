//! Accepting gRPC connections over TLS: each handshake runs on its own
//! task (a slow client holds up no other), with the configuration in force
//! when it connected; finished streams go to tonic.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use super::ServerTls;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS streams of the connections `accept` yields, until `stop` turns
/// true; and the task that accepts them.
pub fn incoming<S, A, F>(
    mut accept: A,
    tls: Arc<ServerTls>,
    mut stop: watch::Receiver<bool>,
) -> (ReceiverStream<io::Result<TlsStream<S>>>, JoinHandle<()>)
where
    A: FnMut() -> F + Send + 'static,
    F: Future<Output = io::Result<S>> + Send,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        loop {
            let io = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                io = accept() => io,
            };
            let io = match io {
                Ok(io) => io,
                Err(e) => {
                    // Out of file descriptors, say: do not spin.
                    tracing::warn!(error = %e, "gRPC: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = TlsAcceptor::from(tls.config());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => refused(&e),
                    Err(_) => tracing::debug!("gRPC TLS: a handshake timed out"),
                }
            });
        }
    });
    (ReceiverStream::new(rx), task)
}

/// Logs a failed handshake: a refused client certificate at warning level
/// (upstream logs "error validating client"), anything else at debug.
fn refused(e: &io::Error) {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match tls {
        Some(
            rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::InvalidCertRevocationList(_),
        ) => {
            tracing::warn!(error = %e, "gRPC TLS: a client certificate was refused");
        }
        _ => tracing::debug!(error = %e, "gRPC TLS: a handshake failed"),
    }
}
