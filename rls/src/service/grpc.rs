//! The tonic service for `envoy.service.ratelimit.v3.RateLimitService`.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use super::{RateLimiter, RequestError};

/// [`RateLimiter`] as a gRPC service.
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

#[tonic::async_trait]
impl RateLimitService for RateLimitGrpc {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.0
            .should_rate_limit(request.into_inner())
            .await
            .map(Response::new)
            .map_err(|e| e.to_status())
    }
}
