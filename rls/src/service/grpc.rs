//! The gRPC service `envoy.service.ratelimit.v3.RateLimitService`, mounted
//! by hand rather than through the generated server so that requests are
//! read as [`WireRequest`]s (strings as bytes, see [`super::wire`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::wire::{WireCodec, WireRequest};
use super::{RateLimiter, RequestError};

/// The one method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// [`RateLimiter`] as a gRPC service, for
/// [`tonic::transport::server::Router::add_service`].
#[derive(Clone)]
pub struct RateLimitGrpc(pub Arc<RateLimiter>);

impl RequestError {
    /// The gRPC status of this error. Upstream's own errors are plain Go
    /// errors, which grpc-go sends as `UNKNOWN`.
    pub fn to_status(&self) -> Status {
        let code = match self {
            RequestError::EmptyDomain | RequestError::NoDescriptors | RequestError::NoConfig => {
                tonic::Code::Unknown
            }
            RequestError::TooLarge(_) | RequestError::BadOverrideUnit(_) => {
                tonic::Code::InvalidArgument
            }
            RequestError::StoreUnavailable => tonic::Code::Unavailable,
        };
        Status::new(code, self.to_string())
    }
}

impl NamedService for RateLimitGrpc {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> Service<http::Request<B>> for RateLimitGrpc
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            // What a generated server answers for a method it lacks.
            return Box::pin(async { Ok(Status::unimplemented("").into_http()) });
        }
        let method = ShouldRateLimit(self.0.clone());
        Box::pin(async move { Ok(Grpc::new(WireCodec).unary(method, req).await) })
    }
}

/// The `ShouldRateLimit` call.
struct ShouldRateLimit(Arc<RateLimiter>);

impl UnaryService<WireRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<WireRequest>) -> Self::Future {
        let limiter = self.0.clone();
        Box::pin(async move {
            limiter
                .should_rate_limit(request.into_inner())
                .await
                .map(Response::new)
                .map_err(|e| e.to_status())
        })
    }
}
