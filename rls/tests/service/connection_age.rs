//! `GRPC_MAX_CONNECTION_AGE` and `GRPC_MAX_CONNECTION_AGE_GRACE`, seen by a
//! raw HTTP/2 client, as grpc-go (upstream) applies them: at its age a
//! connection gets a GOAWAY and closes once its calls end; a call still
//! open at age + grace loses the connection. Each wait is for an event,
//! bounded at 20 s.

use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpStream;

use crate::support::*;

const BOUND: Duration = Duration::from_secs(20);

/// A raw HTTP/2 connection to the server's gRPC port: its request handle
/// and the task driving it (ends when the server closes it).
async fn connect(
    rls: &Rls,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(rls.running().grpc_addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    (send, tokio::spawn(connection))
}

#[tokio::test]
async fn at_its_age_a_connection_gets_a_goaway_and_closes() {
    // A grace of an hour: before, tonic waited age + grace and then
    // dropped the connection without a GOAWAY.
    let rls = Rls::start(
        &[],
        &[
            ("GRPC_MAX_CONNECTION_AGE", "200ms"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1h"),
        ],
    )
    .await;
    let (_send, connection) = connect(&rls).await;
    let ended = tokio::time::timeout(BOUND, connection)
        .await
        .expect("a GOAWAY and a close at the connection's age")
        .unwrap();
    // No call was open: the close is the GOAWAY's, not an error.
    assert!(ended.is_ok(), "{ended:?}");
}

#[tokio::test]
async fn a_call_still_open_at_age_plus_grace_loses_its_connection() {
    let rls = Rls::start(
        &[],
        &[
            ("GRPC_MAX_CONNECTION_AGE", "200ms"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "300ms"),
        ],
    )
    .await;
    let (send, connection) = connect(&rls).await;
    let mut send = send.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        rls.running().grpc_addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    // Headers sent, the message never: the call stays open.
    let (response, _body) = send.send_request(request, false).unwrap();
    // The connection ends (the client saw a GOAWAY first, so it reads the
    // close as an end, not an error), and the call with it.
    tokio::time::timeout(BOUND, connection)
        .await
        .expect("the connection closed at age + grace")
        .unwrap()
        .ok();
    let lost = response.await;
    assert!(
        lost.is_err(),
        "the open call ended with its connection: {lost:?}"
    );
}
