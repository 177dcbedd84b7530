//! Binding the listeners, and serving gRPC on TCP or a unix socket, in
//! plain text or over TLS.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tonic::transport::server::Router;

use super::aged::aging;
use super::StartError;
use crate::settings::Settings;
use crate::tls::{self, ServerTls};

/// The gRPC listener: TCP, or a unix socket (`GRPC_UDS`).
pub(super) enum Grpc {
    Tcp(TcpListener),
    #[cfg(unix)]
    Unix(tokio::net::UnixListener),
}

/// The gRPC server, whichever listener it has.
pub(super) type GrpcServe =
    Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

pub(super) async fn bind(what: &'static str, addr: &str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| StartError::Bind {
            what,
            addr: addr.to_owned(),
            error,
        })
}

pub(super) fn local(l: &TcpListener) -> SocketAddr {
    l.local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

impl Grpc {
    pub(super) async fn bind(settings: &Settings) -> Result<Grpc, StartError> {
        match &settings.grpc_uds {
            #[cfg(unix)]
            Some(path) => {
                // A socket left by a previous run would refuse the bind.
                let _ = std::fs::remove_file(path);
                let l = tokio::net::UnixListener::bind(path).map_err(|error| StartError::Bind {
                    what: "GRPC_UDS",
                    addr: path.display().to_string(),
                    error,
                })?;
                Ok(Grpc::Unix(l))
            }
            _ => Ok(Grpc::Tcp(
                bind("GRPC_HOST/GRPC_PORT", &settings.grpc_addr).await?,
            )),
        }
    }

    /// The address (unspecified for a unix socket).
    pub(super) fn addr(&self) -> SocketAddr {
        match self {
            Grpc::Tcp(l) => local(l),
            #[cfg(unix)]
            Grpc::Unix(..) => SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }

    /// Serves `router` here until `stopped`; with `tls`, over TLS (the
    /// task that accepts and handshakes is returned too). Each connection
    /// ends after `life` (`GRPC_MAX_CONNECTION_AGE` and its grace).
    pub(super) fn serve(
        self,
        router: Router,
        tls: Option<Arc<ServerTls>>,
        stopped: watch::Receiver<bool>,
        life: Option<Duration>,
    ) -> (GrpcServe, Option<JoinHandle<()>>) {
        let signal = {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        match (self, tls) {
            (Grpc::Tcp(l), None) => (
                Box::pin(
                    router.serve_with_incoming_shutdown(
                        // Small replies must not wait for delayed ACKs.
                        tonic::transport::server::TcpIncoming::from(l)
                            .with_nodelay(Some(true))
                            .map(aging(life)),
                        signal,
                    ),
                ),
                None,
            ),
            (Grpc::Tcp(l), Some(tls)) => {
                let l = Arc::new(l);
                let accept = move || {
                    let l = l.clone();
                    async move {
                        let (tcp, _) = l.accept().await?;
                        let _ = tcp.set_nodelay(true);
                        Ok(tcp)
                    }
                };
                let (incoming, task) = tls::incoming(accept, tls, stopped);
                (
                    Box::pin(
                        router.serve_with_incoming_shutdown(incoming.map(aging(life)), signal),
                    ),
                    Some(task),
                )
            }
            #[cfg(unix)]
            (Grpc::Unix(l), None) => (
                Box::pin(router.serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(l).map(aging(life)),
                    signal,
                )),
                None,
            ),
            #[cfg(unix)]
            (Grpc::Unix(l), Some(tls)) => {
                let l = Arc::new(l);
                let accept = move || {
                    let l = l.clone();
                    async move { Ok(l.accept().await?.0) }
                };
                let (incoming, task) = tls::incoming(accept, tls, stopped);
                (
                    Box::pin(
                        router.serve_with_incoming_shutdown(incoming.map(aging(life)), signal),
                    ),
                    Some(task),
                )
            }
        }
    }
}
