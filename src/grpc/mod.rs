//! gRPC: the layer's own answers as gRPC statuses, and keys for tonic.
//!
//! A gRPC client reads the outcome of a call from `grpc-status`, not from
//! the HTTP status: a bare `429` reaches it as `UNAVAILABLE` or `INTERNAL`,
//! and many clients retry those at once. So, for a gRPC request, the layer
//! answers a *Trailers-Only* response (HTTP 200, `content-type:
//! application/grpc`, the status in the headers, no body):
//!
//! | what happened | `grpc-status` | also |
//! |---|---|---|
//! | a rule denied the call | `RESOURCE_EXHAUSTED` (8) | `grpc-status-details-bin`: a `google.rpc.Status` holding `google.rpc.RetryInfo { retry_delay }`; `retry-after` and the `ratelimit` fields as metadata |
//! | the store failed and the layer fails closed | `UNAVAILABLE` (14) | `grpc-retry-pushback-ms` |
//! | no key: the client sent no identity (default) | `UNAUTHENTICATED` (16) | `PERMISSION_DENIED` (7) if [`OnMissingKey::Reject`](crate::mode::OnMissingKey) was given `403` |
//! | no key: the server did not provide it (no peer address) | `INTERNAL` (13) | also for a `5xx` given to `OnMissingKey::Reject` |
//!
//! This is what Google APIs and Envoy's `rate_limited_as_resource_exhausted`
//! send; tonic reads it as `Code::ResourceExhausted` and tonic-types'
//! `StatusExt::get_details_retry_info` gives the delay.
//!
//! [`ResponseProtocol::Auto`] (the default) answers each request in its own
//! protocol, by its `content-type` (`application/grpc…`), so one layer in
//! front of a server mixing axum routes and tonic services is right for
//! both; HTTP requests get exactly the responses they got before.
//!
//! A rejected call is answered before its request body is read, so the
//! client's request `DATA` can race the answer; h2 then resets the stream.
//! A client denied tens of thousands of times on one connection may trip
//! h2's reset-flood guards (hyper's `max_pending_accept_reset_streams`,
//! `max_local_error_reset_streams`), which close the connection: its
//! in-flight calls fail with a transport error and the client reconnects.
//!
//! [`count_if`](crate::ThrottleLayer::count_if) and
//! [`count_if_outcome`](crate::ThrottleLayer::count_if_outcome) judge a
//! call by its `grpc-status` ([`GrpcCode`]), not by its HTTP 200: read
//! from a Trailers-Only response's headers at once, else from the trailers
//! that end the body, so failed gRPC logins can be counted alone.
//!
//! With the `grpc` feature, [`PeerIp`](crate::key::PeerIp) reads tonic's
//! `TcpConnectInfo` (and, with `grpc-tls`, `TlsConnectInfo<TcpConnectInfo>`),
//! and [`GrpcMethod`] keys a call by its method.
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::{key::{GrpcMethod, PeerIp}, MemoryStore, Policy, ThrottleLayer};
//!
//! // 10 calls a minute per client and method, answered as gRPC statuses.
//! let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_window(10, Duration::from_secs(60))?)
//!     .key((GrpcMethod::full(), PeerIp::new()));
//! // tonic::transport::Server::builder().layer(layer).add_service(…)
//! # let _ = layer;
//! # Ok::<(), tower_throttle::PolicyError>(())
//! ```

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

use crate::response::{add_headers, rejection_response, BodyFormat, Rejection};

mod code;
mod layer;
mod status;

pub use code::GrpcCode;

#[cfg(feature = "grpc")]
pub use crate::key::GrpcMethod;

/// `grpc-status`.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-status-details-bin`: a serialized `google.rpc.Status`.
pub const GRPC_STATUS_DETAILS_BIN: HeaderName = HeaderName::from_static("grpc-status-details-bin");
/// `grpc-retry-pushback-ms`: how long a client's retry policy should wait.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The pushback sent with `UNAVAILABLE` when the store failed: a second,
/// long enough for a store to fail over, short enough not to strand clients.
pub const STORE_FAILURE_PUSHBACK: Duration = Duration::from_secs(1);

/// In which protocol the layer answers a request it rejects itself.
///
/// Set with [`ThrottleLayer::response_protocol`](crate::ThrottleLayer::response_protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResponseProtocol {
    /// HTTP statuses (`429`, `503`, the missing-key status), whatever the request.
    Http,
    /// gRPC statuses in a Trailers-Only response, whatever the request.
    Grpc,
    /// gRPC for requests whose `content-type` starts with
    /// `application/grpc`, HTTP for the others (default).
    #[default]
    Auto,
}

/// The protocol of one request's answer (kept in its plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Http,
    Grpc,
    GrpcWeb,
    GrpcWebText,
}

impl ResponseProtocol {
    /// How to answer a request with these headers.
    #[inline]
    pub(crate) fn reply(self, headers: &HeaderMap) -> Reply {
        match self {
            ResponseProtocol::Http => Reply::Http,
            ResponseProtocol::Grpc => grpc_flavour(headers).unwrap_or(Reply::Grpc),
            ResponseProtocol::Auto => grpc_flavour(headers).unwrap_or(Reply::Http),
        }
    }
}

/// Whether `headers` (a response's) say it is a gRPC call's, in the
/// protocol whose status comes in HTTP trailers (not gRPC-Web's, whose
/// trailers are in the body).
pub(crate) fn grpc_with_trailers(headers: &HeaderMap) -> bool {
    grpc_flavour(headers) == Some(Reply::Grpc)
}

/// The gRPC flavour of a request's `content-type`, if it is one.
fn grpc_flavour(headers: &HeaderMap) -> Option<Reply> {
    let ct = headers.get(CONTENT_TYPE)?.as_bytes();
    let rest = ct.strip_prefix(b"application/grpc")?;
    // `application/grpc`, `+proto`, `+json`, `;params`; not `application/grpcfoo`.
    let web = |r: &[u8]| matches!(r.first(), None | Some(b'+' | b';'));
    if let Some(r) = rest.strip_prefix(b"-web-text") {
        return web(r).then_some(Reply::GrpcWebText);
    }
    if let Some(r) = rest.strip_prefix(b"-web") {
        return web(r).then_some(Reply::GrpcWeb);
    }
    web(rest).then_some(Reply::Grpc)
}

/// The layer's answer to `rejection` in the protocol of `reply`;
/// `misconfigured` marks a missing key the server, not the client, is to
/// blame for.
pub(crate) fn respond(
    body: &BodyFormat,
    reply: Reply,
    rejection: &Rejection<'_>,
    misconfigured: bool,
) -> Box<Response<Bytes>> {
    if reply == Reply::Http {
        return rejection_response(body, rejection);
    }
    let mut response = Box::new(Response::new(Bytes::new()));
    // A Trailers-Only response is HTTP 200 whatever the outcome: the status
    // is in `grpc-status`.
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.reserve(8);
    headers.insert(CONTENT_TYPE, content_type(reply));
    let message = rejection.to_string();
    let code = match rejection {
        Rejection::Limited(info) => {
            let delay = info.retry_after();
            let details =
                status::encode_status(GrpcCode::RESOURCE_EXHAUSTED.as_i32(), &message, delay);
            if let Ok(v) = HeaderValue::try_from(status::base64_unpadded(&details)) {
                headers.insert(GRPC_STATUS_DETAILS_BIN, v);
            }
            if let Some(secs) = info.retry_after_secs() {
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            }
            add_headers(headers, info);
            GrpcCode::RESOURCE_EXHAUSTED
        }
        Rejection::Unavailable(_) => {
            headers.insert(
                GRPC_RETRY_PUSHBACK_MS,
                HeaderValue::from(STORE_FAILURE_PUSHBACK.as_millis() as u64),
            );
            GrpcCode::UNAVAILABLE
        }
        Rejection::Misconfigured { .. } => GrpcCode::INTERNAL,
        Rejection::MissingKey { status, .. } => {
            if misconfigured || status.is_server_error() {
                GrpcCode::INTERNAL
            } else if *status == StatusCode::FORBIDDEN {
                GrpcCode::PERMISSION_DENIED
            } else {
                GrpcCode::UNAUTHENTICATED
            }
        }
    };
    headers.insert(GRPC_STATUS, HeaderValue::from(code.as_i32()));
    if let Ok(v) = HeaderValue::try_from(status::percent_encode(message.trim_end())) {
        headers.insert(GRPC_MESSAGE, v);
    }
    response
}

fn content_type(reply: Reply) -> HeaderValue {
    HeaderValue::from_static(match reply {
        Reply::GrpcWeb => "application/grpc-web",
        Reply::GrpcWebText => "application/grpc-web-text",
        Reply::Grpc | Reply::Http => "application/grpc",
    })
}

#[cfg(test)]
mod tests;
