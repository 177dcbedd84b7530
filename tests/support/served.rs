//! An axum app served on 127.0.0.1:0 and one request to it with hyper's
//! client. Shared through `#[path]`: `#[path = "../support/served.rs"] mod served;`.

use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Serves `app`, with the peer's address in each request
/// (`into_make_service_with_connect_info`) or, as many apps do, without.
pub async fn serve(app: Router, connect_info: bool) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        if connect_info {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, app).await.unwrap();
        } else {
            axum::serve(listener, app).await.unwrap();
        }
    });
    addr
}

/// One `GET` with `headers`: its status, fields and body.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, HeaderMap, String) {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut req = http::Request::get(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let res = client.request(req.body(Empty::<Bytes>::new()).unwrap());
    let (parts, body) = res.await.unwrap().into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    (parts.status, parts.headers, body)
}
