//! `RateLimitRequest` as it is on the wire, its strings as bytes, and the
//! gRPC codec that reads it.
//!
//! A descriptor value may be a header's raw bytes, which need not be
//! UTF-8, and protobuf's C++ writer (Envoy's) only logs a `string` that is
//! not, so such values reach the service. The generated types hold `String`s:
//! prost refuses such a message and tonic answers `INTERNAL` naming the
//! field, which Envoy's default `failure_mode_deny: false` lets through
//! unlimited (upstream's Go server refuses them the same way). Here the
//! message is read with `bytes` for the `string` fields (the same wire
//! format) and each value is counted as its bytes.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// `envoy.service.ratelimit.v3.RateLimitRequest` with `bytes` for its
/// `string` fields.
#[derive(Clone, PartialEq, Message)]
pub struct WireRequest {
    /// `domain`.
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    /// `descriptors`.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    /// `hits_addend`.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor` with bytes
/// entries (`is_negative_hits`, unused here, is skipped as unknown).
#[derive(Clone, PartialEq, Message)]
pub struct WireDescriptor {
    /// `entries`.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    /// `limit`.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// A descriptor entry: `key` and `value` as bytes.
#[derive(Clone, PartialEq, Message)]
pub struct WireEntry {
    /// `key`.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// `value`.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl From<RateLimitRequest> for WireRequest {
    fn from(req: RateLimitRequest) -> Self {
        WireRequest {
            domain: req.domain.into_bytes(),
            descriptors: req
                .descriptors
                .into_iter()
                .map(|d| WireDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| WireEntry {
                            key: e.key.into_bytes(),
                            value: e.value.into_bytes(),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                })
                .collect(),
            hits_addend: req.hits_addend,
        }
    }
}

/// Reads [`WireRequest`]s, writes `RateLimitResponse`s.
#[derive(Clone, Copy, Debug, Default)]
pub struct WireCodec;

/// [`WireCodec`]'s writer.
#[derive(Debug)]
pub struct ResponseEncoder;

/// [`WireCodec`]'s reader.
#[derive(Debug)]
pub struct RequestDecoder;

impl Codec for WireCodec {
    type Encode = RateLimitResponse;
    type Decode = WireRequest;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

impl Encoder for ResponseEncoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: RateLimitResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // The buffer grows as needed; prost fails only on a full one.
        item.encode(dst)
            .map_err(|_| Status::internal("the response could not be written"))
    }
}

impl Decoder for RequestDecoder {
    type Item = WireRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<WireRequest>, Status> {
        // Only malformed protobuf is left to fail here; prost's reason
        // names internal types, so it is not returned.
        WireRequest::decode(src).map(Some).map_err(|e| {
            tracing::debug!(error = %e, "an undecodable request");
            Status::invalid_argument("the request is not a valid RateLimitRequest")
        })
    }
}
