//! The layer's gRPC answers, in process, decoded with prost.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, StatusCode};
use prost::Message;
use tower::{service_fn, ServiceExt};

use super::*;
use crate::clock::ManualClock;
use crate::decision::PermitId;
use crate::key::{Global, HeaderKey};
use crate::mode::OnMissingKey;
use crate::store::{Answer, Decisions};
use crate::store::{Charge, Store, StoreError};
use crate::{MemoryStore, Policy, ThrottleLayer};
use std::future::Future;

/// A store on a clock that stands still: a minute boundary between two
/// calls would open a new fixed window and admit the call asserted limited.
fn frozen_store() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

type ThrottledResponse = http::Response<crate::body::ThrottleBody<http_body_util::Full<Bytes>>>;

async fn call<St: Store>(layer: &ThrottleLayer<St>, content_type: &str) -> ThrottledResponse {
    let inner = service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
            Bytes::from_static(b"ok"),
        )))
    });
    let req = Request::builder()
        .uri("/grpc.health.v1.Health/Check")
        .header(CONTENT_TYPE, content_type)
        .body(())
        .unwrap();
    tower_layer::Layer::layer(layer, inner)
        .oneshot(req)
        .await
        .unwrap()
}

fn header<'a>(r: &'a ThrottledResponse, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// The `google.rpc.Status` of `grpc-status-details-bin`, decoded by prost.
fn details(r: &ThrottledResponse) -> tonic_types::pb::Status {
    let b64 = header(r, "grpc-status-details-bin").expect("details");
    assert!(!b64.ends_with('='), "-bin values are sent unpadded");
    let bytes = decode_base64(b64);
    tonic_types::pb::Status::decode(bytes.as_slice()).unwrap()
}

fn decode_base64(s: &str) -> Vec<u8> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextets: Vec<u32> = s
        .bytes()
        .map(|c| alphabet.iter().position(|&a| a == c).unwrap() as u32)
        .collect();
    let mut out = Vec::new();
    for chunk in sextets.chunks(4) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0, |n, (i, &s)| n | s << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[tokio::test]
async fn a_limited_grpc_call_is_resource_exhausted_with_retry_info() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let layer = ThrottleLayer::new(frozen_store(), policy).key(Global);
    let first = call(&layer, "application/grpc").await;
    assert!(first.headers().get("grpc-status").is_none());

    let limited = call(&layer, "application/grpc+proto").await;
    assert_eq!(limited.status(), StatusCode::OK);
    assert_eq!(header(&limited, "content-type"), Some("application/grpc"));
    assert_eq!(header(&limited, "grpc-status"), Some("8"));
    let message = header(&limited, "grpc-message").unwrap();
    assert!(message.starts_with("Too many requests"), "{message}");
    let retry_after: u64 = header(&limited, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert!(header(&limited, "ratelimit").unwrap().contains("r=0"));
    assert!(header(&limited, "ratelimit-policy").is_some());
    // Trailers-Only: no body at all.
    assert!(http_body::Body::is_end_stream(limited.body()));

    let status = details(&limited);
    assert_eq!(status.code, 8);
    assert_eq!(status.message, message);
    let [any] = &status.details[..] else {
        panic!("one detail: {:?}", status.details)
    };
    assert_eq!(any.type_url, "type.googleapis.com/google.rpc.RetryInfo");
    let info = tonic_types::pb::RetryInfo::decode(any.value.as_slice()).unwrap();
    let delay = info.retry_delay.unwrap();
    let delay = Duration::new(delay.seconds as u64, delay.nanos as u32);
    assert!(delay > Duration::ZERO && delay <= Duration::from_secs(60));
    // Retry-After is the same delay in whole seconds, rounded up.
    assert_eq!(
        retry_after,
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
    );
}

#[tokio::test]
async fn auto_answers_http_requests_as_before() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let layer = ThrottleLayer::new(frozen_store(), policy).key(Global);
    call(&layer, "text/plain").await;
    let http = call(&layer, "application/json").await;
    assert_eq!(http.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(http.headers().get("grpc-status").is_none());
    // Not gRPC: a type that merely starts with the same letters.
    let lookalike = call(&layer, "application/grpcfoo").await;
    assert_eq!(lookalike.status(), StatusCode::TOO_MANY_REQUESTS);
    let web = call(&layer, "application/grpc-web-text+proto").await;
    assert_eq!(header(&web, "grpc-status"), Some("8"));
    assert_eq!(
        header(&web, "content-type"),
        Some("application/grpc-web-text")
    );
}

#[tokio::test]
async fn explicit_protocols_override_the_content_type() {
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let grpc = ThrottleLayer::new(frozen_store(), policy)
        .key(Global)
        .grpc_responses();
    call(&grpc, "").await;
    let r = call(&grpc, "text/plain").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "grpc-status"), Some("8"));

    let http = ThrottleLayer::new(frozen_store(), policy)
        .key(Global)
        .http_responses();
    call(&http, "application/grpc").await;
    let r = call(&http, "application/grpc").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn missing_keys_are_unauthenticated_or_internal() {
    let policy = Policy::fixed_window(5, Duration::from_secs(60)).unwrap();
    let user = ThrottleLayer::new(MemoryStore::new(), policy)
        .key(HeaderKey::new(HeaderName::from_static("x-user-id")));
    let r = call(&user, "application/grpc").await;
    assert_eq!(header(&r, "grpc-status"), Some("16"));
    assert!(header(&r, "grpc-message")
        .unwrap()
        .contains("header is missing"));

    let forbidden = user
        .clone()
        .on_missing_key(OnMissingKey::Reject(StatusCode::FORBIDDEN));
    assert_eq!(
        header(&call(&forbidden, "application/grpc").await, "grpc-status"),
        Some("7")
    );

    // The default key without a peer address: the server's fault.
    let peer = ThrottleLayer::new(MemoryStore::new(), policy);
    let r = call(&peer, "application/grpc").await;
    assert_eq!(header(&r, "grpc-status"), Some("13"));
    // Over HTTP the same misconfiguration is a 500.
    let r = call(&peer, "text/plain").await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

/// A store that always fails.
struct Broken;

impl Store for Broken {
    fn decide<'a>(
        &'a self,
        charges: &'a [Charge<'a>],
    ) -> Answer<impl Future<Output = Result<Decisions, StoreError>> + Send + 'a> {
        let _ = charges;
        Answer::<std::future::Pending<_>>::Now(Err(StoreError::Connection("refused".into())))
    }
    async fn refund(
        &self,
        _: &[u8],
        _: &Policy,
        _: &crate::decision::Receipt,
    ) -> Result<(), StoreError> {
        Ok(())
    }
    async fn reset(&self, _: &[u8], _: &Policy) -> Result<(), StoreError> {
        Ok(())
    }
    async fn release(&self, _: &[u8], _: &Policy, _: PermitId) -> Result<(), StoreError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_store_is_unavailable_with_pushback() {
    let policy = Policy::fixed_window(5, Duration::from_secs(60)).unwrap();
    let layer = ThrottleLayer::new(Broken, policy).key(Global);
    let r = call(&layer, "application/grpc").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "grpc-status"), Some("14"));
    assert_eq!(header(&r, "grpc-retry-pushback-ms"), Some("1000"));
    assert!(header(&r, "grpc-message").unwrap().contains("unavailable"));
}

#[tokio::test]
async fn delay_mode_rejects_in_the_request_protocol_too() {
    // The asynchronous path: the wait (a minute) exceeds the budget.
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let layer = ThrottleLayer::new(frozen_store(), policy)
        .key(Global)
        .delay_up_to(Duration::from_millis(1));
    call(&layer, "application/grpc").await;
    let r = call(&layer, "application/grpc").await;
    assert_eq!(header(&r, "grpc-status"), Some("8"));
    assert!(details(&r).details.len() == 1);
    let r = call(&layer, "text/plain").await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}
