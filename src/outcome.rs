//! What an admitted request's response turned out to be: what
//! [`ThrottleLayer::count_if`](crate::ThrottleLayer::count_if) decides on.

use http::{HeaderMap, StatusCode};

use crate::grpc::{grpc_with_trailers, GrpcCode, GRPC_STATUS};

/// The outcome of an admitted request, as
/// [`count_if_outcome`](crate::ThrottleLayer::count_if_outcome) sees it:
/// the HTTP status of an HTTP response, the `grpc-status` of a gRPC call.
///
/// A gRPC call's HTTP status says nothing of how it went (it is 200 for
/// failures too): its status is in `grpc-status`, in the response headers
/// of a *Trailers-Only* response (what tonic sends when a unary handler
/// returns an error) or in the trailers that end its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The status of a response without `grpc-status`; a `500` when the
    /// inner service failed without a response.
    Http(StatusCode),
    /// The `grpc-status` of a gRPC call, from the response headers or the
    /// trailers.
    Grpc(GrpcCode),
}

impl Outcome {
    /// The HTTP status, or a gRPC status's HTTP equivalent
    /// ([`GrpcCode::http_equivalent`]: `UNAUTHENTICATED` → 401): what
    /// [`count_if`](crate::ThrottleLayer::count_if) sees.
    pub fn http_equivalent(self) -> StatusCode {
        match self {
            Outcome::Http(status) => status,
            Outcome::Grpc(code) => code.http_equivalent(),
        }
    }

    /// The gRPC status, if this is a gRPC call's outcome.
    pub fn grpc_code(self) -> Option<GrpcCode> {
        match self {
            Outcome::Grpc(code) => Some(code),
            Outcome::Http(_) => None,
        }
    }
}

/// What a response's head tells of its outcome.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AtHead {
    /// The outcome: an HTTP response's status, or a Trailers-Only gRPC
    /// response's `grpc-status`.
    Known(Outcome),
    /// A gRPC call whose status comes in the trailers, at the end of the body.
    InTrailers,
    /// A malformed `grpc-status`: unknown, so it counts.
    Unknown,
}

impl AtHead {
    /// What the head of a response (its status and headers) tells.
    pub(crate) fn of(status: StatusCode, headers: &HeaderMap) -> AtHead {
        if let Some(value) = headers.get(GRPC_STATUS) {
            return match GrpcCode::parse(value.as_bytes()) {
                Some(code) => AtHead::Known(Outcome::Grpc(code)),
                None => AtHead::Unknown,
            };
        }
        if grpc_with_trailers(headers) {
            AtHead::InTrailers
        } else {
            AtHead::Known(Outcome::Http(status))
        }
    }
}

/// The outcome in a gRPC call's trailers; `None` when they have no
/// `grpc-status` or a malformed one (unknown, so it counts).
pub(crate) fn in_trailers(trailers: &HeaderMap) -> Option<Outcome> {
    let value = trailers.get(GRPC_STATUS)?;
    GrpcCode::parse(value.as_bytes()).map(Outcome::Grpc)
}

#[cfg(test)]
mod tests {
    use http::header::CONTENT_TYPE;
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn the_head_tells_http_statuses_and_trailers_only_grpc_statuses() {
        let ok = StatusCode::OK;
        assert_eq!(
            AtHead::of(StatusCode::UNAUTHORIZED, &headers(&[])),
            AtHead::Known(Outcome::Http(StatusCode::UNAUTHORIZED))
        );
        let grpc = headers(&[("content-type", "application/grpc")]);
        assert_eq!(AtHead::of(ok, &grpc), AtHead::InTrailers);
        let proto = headers(&[("content-type", "application/grpc+proto")]);
        assert_eq!(AtHead::of(ok, &proto), AtHead::InTrailers);
        let only = headers(&[("content-type", "application/grpc"), ("grpc-status", "16")]);
        assert_eq!(
            AtHead::of(ok, &only),
            AtHead::Known(Outcome::Grpc(GrpcCode::UNAUTHENTICATED))
        );
        let bad = headers(&[("content-type", "application/grpc"), ("grpc-status", "x")]);
        assert_eq!(AtHead::of(ok, &bad), AtHead::Unknown);
        // gRPC-Web keeps its trailers in the body: only its head is read.
        let web = headers(&[(CONTENT_TYPE.as_str(), "application/grpc-web")]);
        assert_eq!(AtHead::of(ok, &web), AtHead::Known(Outcome::Http(ok)));
        let web_only = headers(&[
            ("content-type", "application/grpc-web"),
            ("grpc-status", "7"),
        ]);
        assert_eq!(
            AtHead::of(ok, &web_only),
            AtHead::Known(Outcome::Grpc(GrpcCode::PERMISSION_DENIED))
        );
    }

    #[test]
    fn trailers_tell_the_status_or_nothing() {
        assert_eq!(
            in_trailers(&headers(&[("grpc-status", "0")])),
            Some(Outcome::Grpc(GrpcCode::OK))
        );
        assert_eq!(in_trailers(&headers(&[])), None);
        assert_eq!(in_trailers(&headers(&[("grpc-status", "")])), None);
        assert_eq!(in_trailers(&headers(&[("grpc-status", "1.5")])), None);
    }

    #[test]
    fn http_equivalents() {
        let login = Outcome::Grpc(GrpcCode::UNAUTHENTICATED);
        assert_eq!(login.http_equivalent(), StatusCode::UNAUTHORIZED);
        assert_eq!(login.grpc_code(), Some(GrpcCode::UNAUTHENTICATED));
        let http = Outcome::Http(StatusCode::FORBIDDEN);
        assert_eq!(http.http_equivalent(), StatusCode::FORBIDDEN);
        assert_eq!(http.grpc_code(), None);
    }
}
