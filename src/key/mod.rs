//! Key extractors: which bucket a request is charged to.
//!
//! A [`KeyExtractor`] appends the identity of a request (its client IP, a
//! header, a user id set by an auth layer, the matched route…) to the rule's
//! key. The layer prepends `prefix:rule:` and bounds the length: a part longer
//! than [`MAX_KEY_PART`] bytes is replaced by `#` and a 128-bit SHA-256 digest,
//! stable across processes, so every app instance sharing a Redis store
//! computes the same key.
//!
//! | extractor | key part |
//! |---|---|
//! | [`Global`] | one bucket for everyone |
//! | [`PeerIp`] | the TCP peer's address (IPv6 grouped by a prefix, /56 by default) |
//! | [`ClientIp`] | the client behind trusted proxies (`X-Forwarded-For` / `Forwarded`) |
//! | [`HeaderKey`] | a header's value |
//! | [`BearerToken`] | the digest of `Authorization: Bearer …`, never the token |
//! | [`FromExtension`], [`FromExtensionWith`] | a typed value an auth layer put in the request extensions |
//! | [`UriPath`], `MatchedPathKey` (feature `axum`) | the path, a path prefix, or axum's route template |
//! | [`GrpcMethod`] | a gRPC call's `/package.Service/Method` (or service) |
//! | [`key_fn`] | any closure |
//! | `(A, B)` … `(A, B, C, D)` | several parts joined by `|` |
//! | [`KeyExtractor::or`] | a fallback when the first finds nothing |
//!
//! ```
//! use tower_throttle::key::{BearerToken, KeyExtractor, PeerIp, UriPath};
//!
//! // Per token and route; requests without a token are counted per client address.
//! let key = (BearerToken, UriPath::first_segments(2)).or(PeerIp::new());
//! # let _ = key;
//! ```

use std::fmt;

use http::{Extensions, HeaderMap, Method, Request, Uri, Version};

// Each extractor in its own file; `writer` escapes and bounds what they write.
mod combinator;
mod extension;
mod grpc;
mod header;
mod ip;
mod route;
mod writer;

pub use combinator::{key_fn, KeyFn, Or};
pub use extension::{FromExtension, FromExtensionWith};
pub use grpc::GrpcMethod;
pub use header::{BearerToken, HeaderKey};
pub use ip::{Cidr, CidrError, ClientAddr, ClientIp, ForwardedHeader, PeerIp, DEFAULT_IPV6_PREFIX};
#[cfg(feature = "axum")]
pub use route::MatchedPathKey;
pub use route::UriPath;

pub(crate) use writer::bound_key_part;
pub use writer::KeyWriter;

/// Key parts longer than this many bytes are replaced by their digest.
pub const MAX_KEY_PART: usize = 128;

/// A borrowed view of a request's head, whatever its body type.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    method: &'a Method,
    uri: &'a Uri,
    version: Version,
    headers: &'a HeaderMap,
    extensions: &'a Extensions,
}

impl<'a> RequestHead<'a> {
    /// Borrows the head of `req`.
    pub fn new<B>(req: &'a Request<B>) -> Self {
        RequestHead {
            method: req.method(),
            uri: req.uri(),
            version: req.version(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// Borrows a request head already split from its body.
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        RequestHead {
            method: &parts.method,
            uri: &parts.uri,
            version: parts.version,
            headers: &parts.headers,
            extensions: &parts.extensions,
        }
    }

    /// The method.
    pub fn method(&self) -> &'a Method {
        self.method
    }

    /// The URI.
    pub fn uri(&self) -> &'a Uri {
        self.uri
    }

    /// The HTTP version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The headers.
    pub fn headers(&self) -> &'a HeaderMap {
        self.headers
    }

    /// The extensions (set by the server, by `ConnectInfo`, by auth layers).
    pub fn extensions(&self) -> &'a Extensions {
        self.extensions
    }
}

/// No key could be extracted from a request; the layer's
/// [`OnMissingKey`](crate::mode::OnMissingKey) decides what happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MissingKey {
    reason: &'static str,
    misconfigured: bool,
    /// What a misconfiguration's 500 says: no internals.
    explanation: &'static str,
}

/// What a misconfiguration's 500 says unless its key says more.
const UNEXPLAINED: &str = "the server cannot build this request's rate-limit key";

impl MissingKey {
    /// A key the client failed to supply (no credential, no header), with a
    /// reason shown in the rejection body (keep it free of secrets).
    pub const fn new(reason: &'static str) -> Self {
        MissingKey {
            reason,
            misconfigured: false,
            explanation: UNEXPLAINED,
        }
    }

    /// A key the server cannot build because of its own configuration (no
    /// peer address: the server was not set up to record it). The client
    /// gets a `500` whose body says the rate limiting is misconfigured and
    /// why in general terms ([`MissingKey::explained`]), whatever the
    /// layer's [`OnMissingKey`](crate::mode::OnMissingKey); `reason`, the
    /// fix, is logged once at error level, never sent.
    pub const fn misconfigured(reason: &'static str) -> Self {
        MissingKey {
            reason,
            misconfigured: true,
            explanation: UNEXPLAINED,
        }
    }

    /// What a misconfiguration's `500` tells the client, in place of the
    /// generic "the server cannot build this request's rate-limit key":
    /// what is wrong in the server's own terms, free of code, types and
    /// secrets (the fix stays in the log).
    pub const fn explained(mut self, explanation: &'static str) -> Self {
        self.explanation = explanation;
        self
    }

    /// What a misconfiguration's `500` tells the client.
    pub fn explanation(&self) -> &'static str {
        self.explanation
    }

    /// Whether the server's configuration, not the client, is at fault.
    pub fn is_misconfiguration(&self) -> bool {
        self.misconfigured
    }

    /// Why no key was found.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for MissingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no rate-limit key: {}", self.reason)
    }
}

impl std::error::Error for MissingKey {}

/// Appends the key part of a request.
///
/// Implemented by the extractors of this module, by tuples of extractors, by
/// `Arc<dyn KeyExtractor>` and, through [`key_fn`], by closures.
pub trait KeyExtractor: Send + Sync + 'static {
    /// Writes this request's key part to `key`, or says why there is none.
    /// On error, anything already written is discarded by the caller.
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey>;

    /// Whether the keys of this extractor tell clients apart. `false` for
    /// keys every client of a route shares ([`Global`], [`UriPath`],
    /// [`MatchedPathKey`], [`GrpcMethod`]): a
    /// [lock-out](crate::ThrottleLayer::lockout) never counts strikes
    /// against such a key, since one client's denials would lock out every
    /// client (the rule's own limit still applies). The default is `true`;
    /// a [`key_fn`] closure is taken to tell clients apart.
    fn per_client(&self) -> bool {
        true
    }

    /// Uses `fallback` when this extractor finds no key. The fallback's part
    /// starts with `~`, so it never collides with a part of the first.
    ///
    /// ```
    /// use tower_throttle::key::{FromExtension, KeyExtractor, PeerIp};
    /// # #[derive(Clone)] struct UserId(u64);
    /// # impl std::fmt::Display for UserId {
    /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { self.0.fmt(f) }
    /// # }
    /// // Signed-in users by id, anonymous visitors by address.
    /// let key = FromExtension::<UserId>::new().or(PeerIp::new());
    /// # let _ = key;
    /// ```
    fn or<B: KeyExtractor>(self, fallback: B) -> Or<Self, B>
    where
        Self: Sized,
    {
        Or::new(self, fallback)
    }
}

impl KeyExtractor for std::sync::Arc<dyn KeyExtractor> {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        (**self).extract(req, key)
    }

    fn per_client(&self) -> bool {
        (**self).per_client()
    }
}

/// One bucket for every request (a global limit on a route).
///
/// ```
/// use std::time::Duration;
/// use tower_throttle::{key::Global, MemoryStore, Policy, ThrottleLayer};
///
/// // At most 1000 searches a second, whoever sends them.
/// let layer = ThrottleLayer::new(MemoryStore::new(), Policy::token_bucket(1000, 1000.0)?)
///     .key(Global)
///     .prefix("search");
/// # let _ = layer;
/// # Ok::<(), tower_throttle::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        key.push_raw(b"*");
        Ok(())
    }

    fn per_client(&self) -> bool {
        false
    }
}
