//! The headers proxies report the client in, and the one-time warnings
//! about forwarding headers the configuration does not read.

use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{HeaderName, FORWARDED};
use http::HeaderMap;

use super::Cidr;

/// The header trusted proxies record the client in.
///
/// `X-Forwarded-For` and `Forwarded` list every hop; the others carry one
/// address, the one the proxy received the request from, which the proxy
/// sets (replacing whatever the client sent). Every header is honoured only
/// when the TCP peer is a trusted proxy, so a client that connects directly
/// cannot choose its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`, as nginx's `proxy_set_header X-Real-IP
    /// $remote_addr;` sets it.
    XRealIp,
    /// Cloudflare's `CF-Connecting-IP: client`.
    CfConnectingIp,
    /// `True-Client-IP: client` (Cloudflare Enterprise, Akamai).
    TrueClientIp,
    /// Fly.io's `Fly-Client-IP: client`.
    FlyClientIp,
    /// Fastly's `Fastly-Client-IP: client`.
    FastlyClientIp,
}

impl ForwardedHeader {
    /// Every header a proxy may report the client in.
    pub const ALL: [ForwardedHeader; 7] = [
        ForwardedHeader::XForwardedFor,
        ForwardedHeader::Forwarded,
        ForwardedHeader::XRealIp,
        ForwardedHeader::CfConnectingIp,
        ForwardedHeader::TrueClientIp,
        ForwardedHeader::FlyClientIp,
        ForwardedHeader::FastlyClientIp,
    ];

    /// The header's name.
    pub const fn name(self) -> HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
            ForwardedHeader::XRealIp => HeaderName::from_static("x-real-ip"),
            ForwardedHeader::CfConnectingIp => HeaderName::from_static("cf-connecting-ip"),
            ForwardedHeader::TrueClientIp => HeaderName::from_static("true-client-ip"),
            ForwardedHeader::FlyClientIp => HeaderName::from_static("fly-client-ip"),
            ForwardedHeader::FastlyClientIp => HeaderName::from_static("fastly-client-ip"),
        }
    }

    /// Whether the header lists every hop (rather than one address).
    pub const fn lists_hops(self) -> bool {
        matches!(
            self,
            ForwardedHeader::XForwardedFor | ForwardedHeader::Forwarded
        )
    }
}

/// The first forwarding header of `headers` other than `except`.
fn first_present(headers: &HeaderMap, except: Option<ForwardedHeader>) -> Option<HeaderName> {
    ForwardedHeader::ALL
        .into_iter()
        .filter(|h| Some(*h) != except)
        .map(ForwardedHeader::name)
        .find(|name| headers.contains_key(name))
}

/// Warnings a [`ClientIp`](super::ClientIp) logs once (its clones share
/// them): a misconfiguration shows on every request, the log should not.
#[derive(Debug, Default)]
pub(super) struct Warnings {
    untrusted: AtomicBool,
    unread: AtomicBool,
}

impl Warnings {
    /// No proxy is trusted and a request carries a forwarding header.
    /// Costs one atomic load once warned.
    #[inline]
    pub(super) fn untrusted_forwarding(&self, headers: &HeaderMap) {
        if self.untrusted.load(Ordering::Relaxed) {
            return;
        }
        let Some(name) = first_present(headers, None) else {
            return;
        };
        if !self.untrusted.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "tower_throttle",
                header = %name,
                "a request carries a forwarding header but ClientIp trusts no proxy: the header is \
                 ignored and the TCP peer is the key; behind a proxy every client shares the proxy's \
                 key: trust the proxy with ClientIp::trust"
            );
        }
    }

    /// A trusted proxy sent no `configured` header but another forwarding
    /// header: the proxy's clients all share its key.
    pub(super) fn unread_header(&self, configured: ForwardedHeader, headers: &HeaderMap) {
        if self.unread.load(Ordering::Relaxed) {
            return;
        }
        let Some(name) = first_present(headers, Some(configured)) else {
            return;
        };
        if !self.unread.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "tower_throttle",
                sent = %name,
                read = %configured.name(),
                "a trusted proxy sent a forwarding header ClientIp does not read, and not the one it \
                 reads: the proxy is the key of every client it forwards; set ClientIp::header"
            );
        }
    }
}

/// Trusting `/0` trusts every peer: any client can then write its own key
/// in the forwarding header. Logged when such a range is trusted.
pub(super) fn warn_if_everything(ranges: &[Cidr]) {
    if let Some(all) = ranges.iter().find(|c| c.prefix_len() == 0) {
        tracing::warn!(
            target: "tower_throttle",
            range = %all,
            "ClientIp trusts every address of a family: any client can choose its rate-limit key by \
             sending a forwarding header; trust only your proxies' ranges"
        );
    }
}
