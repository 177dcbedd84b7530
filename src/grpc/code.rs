//! gRPC status codes, without tonic: what `grpc-status` carries.

use std::fmt;

use http::StatusCode;

/// A gRPC status code, as carried by `grpc-status`: what
/// [`count_if_outcome`](crate::ThrottleLayer::count_if_outcome) sees of a
/// gRPC call (in an [`Outcome::Grpc`](crate::outcome::Outcome::Grpc)).
///
/// The constants are the codes of the gRPC specification; a code outside
/// them (a server may send any number) keeps its value. With the `grpc`
/// feature it converts from and into `tonic::Code`.
///
/// ```
/// use tower_throttle::grpc::GrpcCode;
///
/// assert_eq!(GrpcCode::UNAUTHENTICATED.as_i32(), 16);
/// assert_eq!(GrpcCode::from_i32(16), GrpcCode::UNAUTHENTICATED);
/// assert_eq!(GrpcCode::UNAUTHENTICATED.to_string(), "UNAUTHENTICATED");
/// assert_eq!(GrpcCode::UNAUTHENTICATED.http_equivalent(), http::StatusCode::UNAUTHORIZED);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrpcCode(i32);

impl GrpcCode {
    /// `0`: not an error.
    pub const OK: GrpcCode = GrpcCode(0);
    /// `1`: the operation was cancelled, typically by the caller.
    pub const CANCELLED: GrpcCode = GrpcCode(1);
    /// `2`: an unknown error.
    pub const UNKNOWN: GrpcCode = GrpcCode(2);
    /// `3`: the client gave an invalid argument.
    pub const INVALID_ARGUMENT: GrpcCode = GrpcCode(3);
    /// `4`: the deadline passed before the operation completed.
    pub const DEADLINE_EXCEEDED: GrpcCode = GrpcCode(4);
    /// `5`: some requested entity was not found.
    pub const NOT_FOUND: GrpcCode = GrpcCode(5);
    /// `6`: the entity the client tried to create already exists.
    pub const ALREADY_EXISTS: GrpcCode = GrpcCode(6);
    /// `7`: the caller may not execute the operation.
    pub const PERMISSION_DENIED: GrpcCode = GrpcCode(7);
    /// `8`: some resource (a quota: the layer's own refusals) is exhausted.
    pub const RESOURCE_EXHAUSTED: GrpcCode = GrpcCode(8);
    /// `9`: the system is not in a state required for the operation.
    pub const FAILED_PRECONDITION: GrpcCode = GrpcCode(9);
    /// `10`: the operation was aborted (a concurrency conflict).
    pub const ABORTED: GrpcCode = GrpcCode(10);
    /// `11`: the operation was attempted past the valid range.
    pub const OUT_OF_RANGE: GrpcCode = GrpcCode(11);
    /// `12`: the operation is not implemented or supported.
    pub const UNIMPLEMENTED: GrpcCode = GrpcCode(12);
    /// `13`: an internal error.
    pub const INTERNAL: GrpcCode = GrpcCode(13);
    /// `14`: the service is currently unavailable.
    pub const UNAVAILABLE: GrpcCode = GrpcCode(14);
    /// `15`: unrecoverable data loss or corruption.
    pub const DATA_LOSS: GrpcCode = GrpcCode(15);
    /// `16`: the request has no valid authentication credentials.
    pub const UNAUTHENTICATED: GrpcCode = GrpcCode(16);

    /// The code of this number.
    pub const fn from_i32(code: i32) -> GrpcCode {
        GrpcCode(code)
    }

    /// This code's number.
    pub const fn as_i32(self) -> i32 {
        self.0
    }

    /// Whether this is [`GrpcCode::OK`].
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }

    /// The HTTP status this code maps to in `google.rpc.Code`'s
    /// documentation (`UNAUTHENTICATED` → 401, `PERMISSION_DENIED` → 403,
    /// `RESOURCE_EXHAUSTED` → 429, `INTERNAL` → 500, `CANCELLED` → 499…); a
    /// code outside the specification maps as `UNKNOWN`, to 500.
    pub fn http_equivalent(self) -> StatusCode {
        match self {
            GrpcCode::OK => StatusCode::OK,
            // 499 "Client Closed Request", as nginx and google.rpc.Code use it.
            GrpcCode::CANCELLED => StatusCode::from_u16(499).unwrap_or(StatusCode::REQUEST_TIMEOUT),
            GrpcCode::INVALID_ARGUMENT | GrpcCode::FAILED_PRECONDITION | GrpcCode::OUT_OF_RANGE => {
                StatusCode::BAD_REQUEST
            }
            GrpcCode::DEADLINE_EXCEEDED => StatusCode::GATEWAY_TIMEOUT,
            GrpcCode::NOT_FOUND => StatusCode::NOT_FOUND,
            GrpcCode::ALREADY_EXISTS | GrpcCode::ABORTED => StatusCode::CONFLICT,
            GrpcCode::PERMISSION_DENIED => StatusCode::FORBIDDEN,
            GrpcCode::UNAUTHENTICATED => StatusCode::UNAUTHORIZED,
            GrpcCode::RESOURCE_EXHAUSTED => StatusCode::TOO_MANY_REQUESTS,
            GrpcCode::UNIMPLEMENTED => StatusCode::NOT_IMPLEMENTED,
            GrpcCode::UNAVAILABLE => StatusCode::SERVICE_UNAVAILABLE,
            // UNKNOWN, INTERNAL, DATA_LOSS and codes outside the specification.
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The code of a `grpc-status` value (`1*DIGIT`), or `None` if it is
    /// malformed: empty, not all ASCII digits, or past `i32::MAX`.
    pub(crate) fn parse(value: &[u8]) -> Option<GrpcCode> {
        if value.is_empty() {
            return None;
        }
        let mut code: i32 = 0;
        for &b in value {
            if !b.is_ascii_digit() {
                return None;
            }
            code = code.checked_mul(10)?.checked_add(i32::from(b - b'0'))?;
        }
        Some(GrpcCode(code))
    }

    /// The specification's name of this code, if it has one.
    fn name(self) -> Option<&'static str> {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        usize::try_from(self.0)
            .ok()
            .and_then(|i| NAMES.get(i).copied())
    }
}

/// The specification's name (`UNAUTHENTICATED`), or the number.
impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => self.0.fmt(f),
        }
    }
}

/// `UNAUTHENTICATED (16)`, or `GrpcCode(42)`.
impl fmt::Debug for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.0),
            None => write!(f, "GrpcCode({})", self.0),
        }
    }
}

#[cfg(feature = "grpc")]
impl From<tonic::Code> for GrpcCode {
    fn from(code: tonic::Code) -> GrpcCode {
        GrpcCode(code as i32)
    }
}

#[cfg(feature = "grpc")]
impl From<GrpcCode> for tonic::Code {
    /// A code outside the specification is `Unknown`, as tonic reads it.
    fn from(code: GrpcCode) -> tonic::Code {
        tonic::Code::from_i32(code.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_status_values_parse_without_panics() {
        assert_eq!(GrpcCode::parse(b"0"), Some(GrpcCode::OK));
        assert_eq!(GrpcCode::parse(b"16"), Some(GrpcCode::UNAUTHENTICATED));
        assert_eq!(GrpcCode::parse(b"016"), Some(GrpcCode::UNAUTHENTICATED));
        assert_eq!(GrpcCode::parse(b"42"), Some(GrpcCode::from_i32(42)));
        assert_eq!(
            GrpcCode::parse(b"2147483647"),
            Some(GrpcCode::from_i32(i32::MAX))
        );
        for malformed in [
            &b""[..],
            b" 16",
            b"16 ",
            b"-1",
            b"+1",
            b"1a",
            b"UNAUTHENTICATED",
            b"2147483648",
            b"99999999999999999999",
            b"\xff",
        ] {
            assert_eq!(GrpcCode::parse(malformed), None, "{malformed:?}");
        }
    }

    #[test]
    fn names_and_http_equivalents() {
        assert_eq!(
            format!("{:?}", GrpcCode::UNAUTHENTICATED),
            "UNAUTHENTICATED (16)"
        );
        assert_eq!(format!("{:?}", GrpcCode::from_i32(42)), "GrpcCode(42)");
        assert_eq!(GrpcCode::from_i32(-1).to_string(), "-1");
        assert_eq!(GrpcCode::OK.http_equivalent(), StatusCode::OK);
        assert_eq!(GrpcCode::CANCELLED.http_equivalent().as_u16(), 499);
        assert_eq!(
            GrpcCode::PERMISSION_DENIED.http_equivalent(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            GrpcCode::from_i32(42).http_equivalent(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        for i in 0..=16 {
            assert!(GrpcCode::from_i32(i).name().is_some());
        }
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn converts_with_tonic() {
        for i in -1..=17 {
            let code = GrpcCode::from_i32(i);
            let tonic_code = tonic::Code::from(code);
            assert_eq!(tonic_code, tonic::Code::from_i32(i));
            if code.name().is_some() {
                assert_eq!(GrpcCode::from(tonic_code), code);
            }
        }
    }
}
