//! A concurrency limit over real WebSockets: axum's `ws` served over TCP on
//! loopback, tokio-tungstenite as the client. An upgraded connection holds
//! its permit until it closes, not until the handshake response ends.

use std::net::SocketAddr;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use axum::{Extension, Router};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
use tower_throttle::key::Global;
use tower_throttle::upgrade::UpgradePermit;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

/// Echoes until the client closes; reports on `closed` once its permit is
/// dropped.
async fn echo(mut socket: WebSocket) {
    while let Some(Ok(msg)) = socket.recv().await {
        match msg {
            Message::Close(_) => break,
            msg => {
                if socket.send(msg).await.is_err() {
                    break;
                }
            }
        }
    }
}

async fn serve(claim: bool) -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
    let (closed_tx, closed) = mpsc::unbounded_channel();
    let handler = move |ws: WebSocketUpgrade, permit: Option<Extension<UpgradePermit>>| {
        let closed_tx = closed_tx.clone();
        async move {
            let held = permit.filter(|_| claim).and_then(|Extension(p)| p.claim());
            let response: Response = ws.on_upgrade(move |socket| async move {
                echo(socket).await;
                drop(held);
                let _ = closed_tx.send(());
            });
            response
        }
    };
    let app = Router::new()
        .route("/ws", get(handler))
        .layer(ThrottleLayer::new(MemoryStore::new(), Policy::concurrency(1).unwrap()).key(Global));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, closed)
}

type Client =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket: the socket, or the status of the refused handshake.
async fn open(addr: SocketAddr) -> Result<Client, u16> {
    let req = format!("ws://{addr}/ws").into_client_request().unwrap();
    match tokio_tungstenite::connect_async(req).await {
        Ok((socket, response)) => {
            assert_eq!(response.status(), 101);
            Ok(socket)
        }
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(e) => panic!("handshake failed: {e}"),
    }
}

async fn round_trip(socket: &mut Client, text: &str) {
    socket.send(tungstenite::Message::text(text)).await.unwrap();
    let echoed = socket.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), text);
}

#[tokio::test]
async fn an_open_websocket_holds_its_permit_until_it_closes() {
    let (addr, mut closed) = serve(true).await;
    let mut first = open(addr).await.expect("the first WebSocket is admitted");
    round_trip(&mut first, "one").await;
    assert_eq!(open(addr).await.err(), Some(429), "the first is still open");
    // Still open and working after the refusal.
    round_trip(&mut first, "still here").await;
    first.close(None).await.unwrap();
    while first.next().await.is_some() {}
    closed.recv().await.expect("the server closed its side");
    let mut third = open(addr).await.expect("admitted once the first closed");
    round_trip(&mut third, "three").await;
}

/// A handler that does not claim the permit gets the old behaviour, which
/// the test pins down: the permit covers only the handshake.
#[tokio::test]
async fn an_unclaimed_permit_covers_only_the_handshake() {
    let (addr, _closed) = serve(false).await;
    let mut first = open(addr).await.unwrap();
    round_trip(&mut first, "one").await;
    let mut second = open(addr)
        .await
        .expect("the handshake's permit was released");
    round_trip(&mut second, "two").await;
}
