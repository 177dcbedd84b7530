//! Descriptor bytes that are not UTF-8 (what Envoy forwards from a raw
//! header byte), sent by a tonic client of this file's own: prost messages
//! whose strings are `bytes`, since the generated client only takes
//! `String`. They are counted as their bytes, never answered `INTERNAL`.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::redis::redis_support::RedisServer;
use crate::support::*;

/// `RateLimitRequest` with its strings as bytes (the same wire format).
#[derive(Clone, PartialEq, Message)]
pub struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// Sends already-encoded request bytes; decodes the envoy response.
struct FrameCodec;

struct FrameEncoder;

struct ResponseDecoder;

impl Codec for FrameCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = FrameEncoder;
    type Decoder = ResponseDecoder;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl Encoder for FrameEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        prost::bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for ResponseDecoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RateLimitResponse>, Status> {
        RateLimitResponse::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("test client: {e}")))
    }
}

/// A raw client of one server.
pub struct RawClient(tonic::client::Grpc<Channel>);

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> RawClient {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .expect("a gRPC connection");
        RawClient(tonic::client::Grpc::new(channel))
    }

    /// Sends `frame` as the request message.
    pub async fn send(&mut self, frame: Vec<u8>) -> Result<RateLimitResponse, Status> {
        self.0.ready().await.expect("the channel is ready");
        let path = PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        );
        self.0
            .unary(tonic::Request::new(frame), path, FrameCodec)
            .await
            .map(tonic::Response::into_inner)
    }

    /// One descriptor of `(key, value)` byte entries in `domain`.
    pub async fn ask(
        &mut self,
        domain: &[u8],
        entries: &[(&[u8], &[u8])],
    ) -> Result<RateLimitResponse, Status> {
        let req = RawRequest {
            domain: domain.to_vec(),
            descriptors: vec![RawDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| RawEntry {
                        key: k.to_vec(),
                        value: v.to_vec(),
                    })
                    .collect(),
            }],
        };
        self.send(req.encode_to_vec()).await
    }

    /// `(code, remaining)` of a one-entry descriptor `k: value` in `d`.
    pub async fn codes(&mut self, value: &[u8]) -> Vec<(i32, u32)> {
        codes(&self.ask(b"d", &[(b"k", value)]).await.expect("an answer"))
    }
}

const CFG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: w\n    value: pre*\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";

/// A valid UTF-8 value of two-, three- and four-byte characters.
const TEXT: &str = "é€😀";

#[tokio::test]
async fn values_that_are_not_utf8_are_counted_as_their_bytes() {
    let mut rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let mut raw = RawClient::connect(rls.running().grpc_addr).await;
    // A single 0xFF byte: a counter of its own, counted to the limit.
    assert_eq!(raw.codes(b"\xff").await, vec![(OK, 1)]);
    assert_eq!(raw.codes(b"\xff").await, vec![(OK, 0)]);
    assert_eq!(raw.codes(b"\xff").await, vec![(OVER, 0)]);
    // Lossless: another invalid byte and U+FFFD (what a lossy decoding
    // would make of both) count apart from it.
    assert_eq!(raw.codes(b"\xfe").await, vec![(OK, 1)]);
    let r = rls.ask("d", vec![d(&[("k", "\u{fffd}")])]).await;
    assert_eq!(codes(&r), vec![(OK, 1)]);
    // Valid UTF-8 sent as bytes is the String the generated client sends:
    // one counter, so keys are unchanged for every value that is text.
    assert_eq!(raw.codes(TEXT.as_bytes()).await, vec![(OK, 1)]);
    let r = rls.ask("d", vec![d(&[("k", TEXT)])]).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    // Cut inside the emoji: a value of its own.
    let cut = &TEXT.as_bytes()[..TEXT.len() - 1];
    assert_eq!(raw.codes(cut).await, vec![(OK, 1)]);
    assert_eq!(raw.codes(cut).await, vec![(OK, 0)]);
    // Empty: the generated client's "" too.
    assert_eq!(raw.codes(b"").await, vec![(OK, 1)]);
    let r = rls.ask("d", vec![d(&[("k", "")])]).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    // Long: RLS_MAX_VALUE_BYTES (4096) bytes are counted, one more is
    // refused with a plain message that does not echo the value.
    assert_eq!(raw.codes(&[0xff; 4096]).await, vec![(OK, 1)]);
    assert_eq!(raw.codes(&[0xff; 4096]).await, vec![(OK, 0)]);
    let e = raw.ask(b"d", &[(b"k", &[0xff; 4097])]).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::InvalidArgument,
            "request too large: an entry key or value of more than 4096 bytes"
        )
    );
    // A domain is bounded as a value is: 4096 bytes answer (no such
    // domain: no limit), one more is refused.
    let r = raw.ask(&[b'd'; 4096], &[(b"k", b"v")]).await.unwrap();
    assert_eq!(codes(&r), vec![(OK, 0)]);
    let e = raw.ask(&[b'd'; 4097], &[(b"k", b"v")]).await.unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::InvalidArgument,
            "request too large: a domain of more than 4096 bytes"
        )
    );
    // A wildcard's prefix matches the bytes before any.
    let r = raw.ask(b"d", &[(b"w", b"pre\xff\x00")]).await.unwrap();
    assert_eq!(codes(&r), vec![(OK, 2)]);
    // A key or a domain that is not UTF-8 equals no configured one: no
    // limit, as for an unknown key or domain.
    for (domain, key) in [(&b"d"[..], &b"\xff"[..]), (b"d\xff", b"k")] {
        let r = raw.ask(domain, &[(key, b"v")]).await.unwrap();
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
        assert!(r.statuses[0].current_limit.is_none());
    }
    rls.stop().await;
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_naming_nothing_internal() {
    let rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let mut raw = RawClient::connect(rls.running().grpc_addr).await;
    let frames: [&[u8]; 3] = [
        // The domain says 5 bytes and holds 1.
        b"\x0a\x05d",
        // The domain as a varint.
        b"\x08\x01",
        // A descriptor whose entry is cut short.
        b"\x0a\x01d\x12\x04\x0a\x05\x0a\x01",
    ];
    for frame in frames {
        let e = raw.send(frame.to_vec()).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (
                Code::InvalidArgument,
                "the request is not a valid RateLimitRequest"
            ),
            "{frame:?}"
        );
    }
    // The connection and the server still answer.
    assert_eq!(raw.codes(b"v").await, vec![(OK, 1)]);
    rls.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_keys_hold_the_raw_bytes_on_redis() {
    let redis = RedisServer::start();
    let mut rls = crate::redis::start(&redis, &[]).await;
    let mut raw = RawClient::connect(rls.running().grpc_addr).await;
    let cut = &TEXT.as_bytes()[..TEXT.len() - 1];
    for value in [&b"\xff"[..], TEXT.as_bytes(), cut, b""] {
        assert_eq!(raw.codes(value).await, vec![(OK, 4)], "{value:?}");
    }
    let keys: Vec<Vec<u8>> = ::redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .unwrap();
    for value in [&b"\xff"[..], TEXT.as_bytes(), cut, b""] {
        let want = [b"d_k_", value, format!("_{T0}").as_bytes()].concat();
        assert!(keys.contains(&want), "no key {want:?} in {keys:?}");
    }
    // The generated client's String lands on the same key.
    let r = rls.ask("d", vec![d(&[("k", TEXT)])]).await;
    assert_eq!(codes(&r), vec![(OK, 3)]);
    rls.stop().await;
}

#[tokio::test]
async fn json_refuses_lone_surrogates_and_counts_pairs() {
    let mut rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let addr = rls.running().http_addr;
    let body = |value: &str| {
        format!(
            r#"{{"domain":"d","descriptors":[{{"entries":[{{"key":"k","value":"{value}"}}]}}]}}"#
        )
    };
    for value in [r"\ud800", r"\udc00", r"\ud800\u0041", r"x\ud83d"] {
        let (status, _, text) = http(addr, "POST", "/json", &body(value)).await;
        assert_eq!((status, text.as_str()), (400, "Bad Request\n"), "{value}");
    }
    // JSON is UTF-8: a raw 0xFF byte in a string is no JSON.
    let mut bytes = body("v").into_bytes();
    let at = bytes.iter().rposition(|b| *b == b'v').unwrap();
    bytes[at] = 0xff;
    let (status, _, text) = http_bytes(addr, "POST", "/json", &bytes).await;
    assert_eq!((status, text.as_str()), (400, "Bad Request\n"));
    // A surrogate pair is its character: the counter gRPC bytes reach.
    let (status, _, text) = http(addr, "POST", "/json", &body(r"\ud83d\ude00")).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains(r#""limitRemaining":1"#), "{text}");
    let r = rls.ask("d", vec![d(&[("k", "😀")])]).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    rls.stop().await;
}
