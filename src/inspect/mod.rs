//! Asking a [`ThrottleLayer`](crate::ThrottleLayer) about a client outside
//! of requests (an admin endpoint, support tooling, tests), by what the app
//! knows of the client: a bearer token, an address, a header's value, a
//! user id an auth layer would put in the extensions.
//!
//! The layer runs its own key extractors, every rule's own, on a request
//! head built as the client would send it, so the crate does the hashing
//! and escaping (a [`BearerToken`](crate::key::BearerToken) key is a digest
//! of the token) and the keys are the ones the client's requests are
//! charged to:
//! [`ThrottleLayer::peek_request`](crate::ThrottleLayer::peek_request) reads
//! their state, [`ThrottleLayer::reset_request`](crate::ThrottleLayer::reset_request)
//! forgets them. A rule whose key cannot be built from that head is
//! reported as such ([`RuleState::key`]), not as an error of the call.
//!
//! ```
//! use std::time::Duration;
//! use tower_throttle::inspect::Client;
//! use tower_throttle::key::BearerToken;
//! use tower_throttle::{MemoryStore, Policy, ThrottleLayer};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let layer = ThrottleLayer::new(MemoryStore::new(), Policy::fixed_window(5, Duration::from_secs(60))?)
//!     .key(BearerToken);
//! let state = layer.peek_request(&Client::bearer("s3cr3t")).await?;
//! assert_eq!(state.get("default").unwrap().decision.unwrap().remaining, 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::net::IpAddr;
use std::sync::Arc;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::request::Parts;
use http::{Request, Uri};

use crate::decision::Decision;
use crate::key::{MissingKey, RequestHead};
use crate::policy::Policy;

/// A request head as a client would send it, built from what the app
/// knows of that client, to ask a layer about the client's keys.
///
/// Each constructor sets one identity; the `and_` methods add more, for
/// layers whose rules key by different things (a token and an address).
/// A value no request could carry (a token or header value with bytes a
/// header cannot hold) is left out, so the rules keyed by it report a
/// missing key.
///
/// ```
/// use std::net::IpAddr;
/// use tower_throttle::inspect::Client;
///
/// #[derive(Clone)]
/// struct UserId(u64);
///
/// let ip: IpAddr = "203.0.113.7".parse().unwrap();
/// let by_token = Client::bearer("s3cr3t").and_peer_ip(ip);
/// let by_user = Client::extension(UserId(42)); // what an auth layer inserts
/// # let _ = (by_token, by_user);
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    head: Parts,
}

impl Default for Client {
    fn default() -> Self {
        Self::new()
    }
}

impl Client {
    /// `GET /` with no header, extension or address: add what the rules
    /// read.
    pub fn new() -> Self {
        Client {
            head: Request::new(()).into_parts().0,
        }
    }

    /// A client sending `Authorization: Bearer <token>` (what
    /// [`BearerToken`](crate::key::BearerToken) keys by, as a digest).
    pub fn bearer(token: impl AsRef<[u8]>) -> Self {
        Self::new().and_bearer(token)
    }

    /// A client connecting from `ip` (what [`PeerIp`](crate::key::PeerIp)
    /// keys by, and [`ClientIp`](crate::key::ClientIp) when `ip` is not a
    /// trusted proxy).
    pub fn peer_ip(ip: IpAddr) -> Self {
        Self::new().and_peer_ip(ip)
    }

    /// A client sending header `name` with `value` (what
    /// [`HeaderKey`](crate::key::HeaderKey) keys by).
    pub fn header(name: HeaderName, value: impl AsRef<[u8]>) -> Self {
        Self::new().and_header(name, value)
    }

    /// A request carrying `value` in its extensions, as an auth layer
    /// would insert it (what [`FromExtension`](crate::key::FromExtension)
    /// keys by).
    pub fn extension<T: Clone + Send + Sync + 'static>(value: T) -> Self {
        Self::new().and_extension(value)
    }

    /// The head of a request of your own (its body is dropped).
    pub fn from_request<B>(req: Request<B>) -> Self {
        Client {
            head: req.into_parts().0,
        }
    }

    /// Adds `Authorization: Bearer <token>`.
    #[must_use]
    pub fn and_bearer(self, token: impl AsRef<[u8]>) -> Self {
        let value = [b"Bearer ", token.as_ref()].concat();
        self.and_header(AUTHORIZATION, value)
    }

    /// Sets the peer address: the extension a server records it in.
    #[must_use]
    pub fn and_peer_ip(mut self, ip: IpAddr) -> Self {
        self.head.extensions.insert(ip);
        self
    }

    /// Sets header `name` to `value` (its only line).
    #[must_use]
    pub fn and_header(mut self, name: HeaderName, value: impl AsRef<[u8]>) -> Self {
        // A value a request cannot carry is no client's: its rules report
        // a missing key rather than a key no request could reach.
        match HeaderValue::from_bytes(value.as_ref()) {
            Ok(value) => {
                self.head.headers.insert(name, value);
            }
            Err(_) => {
                self.head.headers.remove(name);
            }
        }
        self
    }

    /// Adds `value` to the extensions.
    #[must_use]
    pub fn and_extension<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.head.extensions.insert(value);
        self
    }

    /// Sets the URI (for keys of the path, [`UriPath`](crate::key::UriPath)).
    #[must_use]
    pub fn and_uri(mut self, uri: Uri) -> Self {
        self.head.uri = uri;
        self
    }

    /// The request head built.
    pub fn parts(&self) -> &Parts {
        &self.head
    }
}

/// What a layer can read a client's keys from: a [`Client`], a request, a
/// request's head.
pub trait AsRequestHead {
    /// The head the layer's extractors read.
    fn request_head(&self) -> RequestHead<'_>;
}

impl AsRequestHead for Client {
    fn request_head(&self) -> RequestHead<'_> {
        RequestHead::from_parts(&self.head)
    }
}

impl<B> AsRequestHead for Request<B> {
    fn request_head(&self) -> RequestHead<'_> {
        RequestHead::new(self)
    }
}

impl AsRequestHead for Parts {
    fn request_head(&self) -> RequestHead<'_> {
        RequestHead::from_parts(self)
    }
}

/// One rule's answer for a client: its key and, for a peek, its state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleState {
    /// The rule's name.
    pub rule: Arc<str>,
    /// The policy the client's requests get under this rule: the rule's
    /// own, or the one its policy function or resolver picks for them.
    pub policy: Policy,
    /// The store key the client's requests are charged to
    /// (`prefix:rule:key-part`, as in a hottest-keys report), or why the
    /// rule's extractor finds none in what was given.
    pub key: Result<Box<[u8]>, MissingKey>,
    /// The key's state, read without charging (a check of cost 0:
    /// `remaining`, `limit`, `reset_after`): `Some` for a peek of a key
    /// found; `None` when the key is missing, and in the answer of a reset.
    pub decision: Option<Decision>,
}

impl RuleState {
    pub(crate) fn new(
        rule: Arc<str>,
        policy: Policy,
        key: Result<Box<[u8]>, MissingKey>,
        decision: Option<Decision>,
    ) -> Self {
        RuleState {
            rule,
            policy,
            key,
            decision,
        }
    }
}

/// Every rule's [`RuleState`] for one client, in the layer's rule order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyStates {
    rules: Vec<RuleState>,
}

impl KeyStates {
    pub(crate) fn new(rules: Vec<RuleState>) -> Self {
        KeyStates { rules }
    }

    /// The answer of the rule named `rule`.
    pub fn get(&self, rule: &str) -> Option<&RuleState> {
        self.rules.iter().find(|r| &*r.rule == rule)
    }

    /// Every rule's answer, in the layer's rule order.
    pub fn iter(&self) -> std::slice::Iter<'_, RuleState> {
        self.rules.iter()
    }

    /// Whether a request of cost 1 would pass every rule that has a key
    /// for the client (`remaining` at least 1 everywhere).
    pub fn allowed(&self) -> bool {
        (self.rules.iter())
            .filter_map(|r| r.decision.as_ref())
            .all(|d| d.remaining >= 1)
    }
}

impl<'a> IntoIterator for &'a KeyStates {
    type Item = &'a RuleState;
    type IntoIter = std::slice::Iter<'a, RuleState>;

    fn into_iter(self) -> Self::IntoIter {
        self.rules.iter()
    }
}

impl IntoIterator for KeyStates {
    type Item = RuleState;
    type IntoIter = std::vec::IntoIter<RuleState>;

    fn into_iter(self) -> Self::IntoIter {
        self.rules.into_iter()
    }
}
