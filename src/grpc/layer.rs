//! The layer's gRPC settings.

use super::ResponseProtocol;
use crate::layer::ThrottleLayer;
use crate::store::Store;

impl<St: Store> ThrottleLayer<St> {
    /// In which protocol rejections are answered (default
    /// [`ResponseProtocol::Auto`]: gRPC statuses to gRPC requests, HTTP
    /// statuses to the others). See [`grpc`](crate::grpc) for the statuses.
    ///
    /// A [custom response](Self::custom_response) applies to HTTP answers
    /// only: gRPC answers carry no body for it to shape.
    pub fn response_protocol(mut self, protocol: ResponseProtocol) -> Self {
        self.settings.protocol = protocol;
        self
    }

    /// [`ResponseProtocol::Grpc`]: every rejection is a gRPC status, for a
    /// layer in front of gRPC services only (`tonic::transport::Server::layer`).
    pub fn grpc_responses(self) -> Self {
        self.response_protocol(ResponseProtocol::Grpc)
    }

    /// [`ResponseProtocol::Http`]: every rejection is an HTTP status, even
    /// to a request that says it is gRPC.
    pub fn http_responses(self) -> Self {
        self.response_protocol(ResponseProtocol::Http)
    }
}
