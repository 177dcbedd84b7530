//! Client addresses: the TCP peer, or the client behind trusted proxies.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::Extensions;

use super::{bound_key_part, KeyExtractor, KeyWriter, MissingKey, RequestHead, MAX_KEY_PART};

mod cidr;
mod embedded;
mod forwarded;
mod headers;

use cidr::mask_v6;
pub use cidr::{Cidr, CidrError};
use embedded::embedded_client_ipv4;

use forwarded::{forwarded_for, parse_node, unquote, Hops};
pub use headers::ForwardedHeader;
use headers::{warn_if_everything, Warnings};

/// IPv6 clients are grouped by this prefix length by default: a /56 is what
/// one subscriber typically gets, so one user cannot rotate through 2⁷²
/// addresses to dodge a limit.
pub const DEFAULT_IPV6_PREFIX: u8 = 56;

/// At most this many hops of a forwarding header are examined.
const MAX_HOPS: usize = 64;

const NO_PEER: MissingKey = MissingKey::misconfigured(
    "the peer address is unknown (serve with axum's `into_make_service_with_connect_info::<SocketAddr>()` \
     or insert a `SocketAddr` request extension)",
)
.explained("the server does not pass the client's network address to its rate limiter");

/// The TCP peer's address, from axum's `ConnectInfo<SocketAddr>` (feature
/// `axum`), tonic's `TcpConnectInfo` (feature `grpc`; `TlsConnectInfo` with
/// `grpc-tls`), or a `SocketAddr` / `IpAddr` request extension.
///
/// IPv6 addresses that carry an IPv4 client are keyed exactly as that IPv4
/// address, so a client has one bucket whichever way it came, and the
/// clients of a translator or relay do not share one. The forms, by prefix:
///
/// - IPv4-compatible `::a.b.c.d` (RFC 4291; not `::` nor `::1`);
/// - IPv4-mapped `::ffff:a.b.c.d` (RFC 4291);
/// - IPv4-translated `::ffff:0:a.b.c.d` (SIIT, RFC 2765);
/// - NAT64 `64:ff9b::/96` (RFC 6052) and `64:ff9b:1::/48` (RFC 8215): the
///   last 32 bits, which in `64:ff9b:1::/48` is the layout of a /96 prefix,
///   the common deployment (a translator using a shorter prefix there, IPv4
///   address in bits 48–88, say, would have its clients keyed by bits they
///   do not own);
/// - 6to4 `2002::/16` (RFC 3056): the site's IPv4 address, bits 16–47
///   (`2002:V4ADDR::/48`);
/// - Teredo `2001:0::/32` exactly (RFC 4380): the client's public IPv4
///   address, the last 32 bits inverted (so `2001:db8::/32` stays IPv6).
///
/// Other IPv6 addresses are grouped by their first [`DEFAULT_IPV6_PREFIX`]
/// bits unless told otherwise.
///
/// ```
/// use std::net::SocketAddr;
/// use tower_throttle::key::{KeyExtractor, KeyWriter, PeerIp, RequestHead};
///
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert("[2001:db8:1:2ff::9]:443".parse::<SocketAddr>().unwrap());
/// let mut key = Vec::new();
/// PeerIp::new().extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key)).unwrap();
/// assert_eq!(key, b"2001:db8:1:200::/56");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeerIp {
    v6_prefix: u8,
}

impl PeerIp {
    /// The peer address, IPv6 grouped by /56.
    pub const fn new() -> Self {
        PeerIp {
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Groups IPv6 addresses by their first `bits` bits (128: no grouping).
    #[must_use]
    pub const fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = if bits > 128 { 128 } else { bits };
        self
    }
}

impl Default for PeerIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let ip = peer_ip(req.extensions()).ok_or(NO_PEER)?;
        write_ip(key.buf(), ip, self.v6_prefix);
        Ok(())
    }
}

/// The peer address a server recorded in the request extensions.
pub(crate) fn peer_ip(ext: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "grpc")]
    if let Some(ip) = super::grpc::tonic_peer_ip(ext) {
        return Some(ip);
    }
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
}

/// Writes `ip` (IPv4 when it carries one, see [`embedded_client_ipv4`];
/// IPv6 masked to `/v6_prefix`) without allocating.
pub(crate) fn write_ip(out: &mut Vec<u8>, ip: IpAddr, v6_prefix: u8) {
    let ip = match ip {
        IpAddr::V6(v6) => embedded_client_ipv4(v6).map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    };
    // Writing to a Vec cannot fail.
    let _ = match ip {
        IpAddr::V4(v4) => write!(out, "{v4}"),
        IpAddr::V6(v6) if v6_prefix >= 128 => write!(out, "{v6}"),
        IpAddr::V6(v6) => write!(out, "{}/{v6_prefix}", mask_v6(v6, v6_prefix)),
    };
}

/// Whom [`ClientIp`] charges a request to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAddr<'a> {
    /// An address: the peer, or the nearest hop the trusted proxies reported
    /// that is not itself trusted.
    Ip(IpAddr),
    /// The nearest untrusted hop the trusted proxies reported is not an
    /// address (`for=unknown`, an obfuscated `_name`, bytes that are not
    /// UTF-8…): its bytes as written (a `Forwarded` value without its quotes;
    /// empty for an element with no `for`). The key is `?` and these bytes,
    /// escaped, so it is nobody's address.
    Opaque(&'a [u8]),
}

/// The client's address when the app runs behind proxies you trust.
///
/// Starting from the peer, while the current hop is a trusted proxy, the
/// forwarding header is read from the right (later header lines first): the
/// first hop that is not a trusted proxy is the client. Entries left of it
/// were written by the client itself and are ignored, so a spoofed
/// `X-Forwarded-For` cannot change the key. With no trusted proxy
/// configured, only the peer address is used.
///
/// Single-address headers (`X-Real-IP`, `CF-Connecting-IP`,
/// `True-Client-IP`, `Fly-Client-IP`, `Fastly-Client-IP`; see
/// [`ForwardedHeader`]) are opt-ins read the same way: only when the peer is
/// trusted, and then the address in the header (its last line, the one the
/// nearest proxy wrote) is the client; a value that is not an address is an
/// opaque key as below.
///
/// Misconfigurations are logged once per extractor (at `WARN`, target
/// `tower_throttle`), never per request: a request carrying a forwarding
/// header while no proxy is trusted (behind a proxy, every client would
/// share the proxy's key), a trusted proxy sending a forwarding header other
/// than the one configured (all its clients would share its key), and
/// trusting a whole address family (`0.0.0.0/0`, `::/0`: every client could
/// choose its own key).
///
/// Headers are parsed as bytes, hop by hop: a hop that is not valid UTF-8 or
/// not an address spoils only itself, so bytes a client writes on the left
/// never change how the hops its proxies appended are read. Hops may carry a
/// port (`1.2.3.4:5678`, `[2001:db8::1]:80`); `Forwarded` (RFC 7239) is read
/// with its quoted strings (a comma or `;` inside quotes splits nothing) and
/// its `for` parameter is the hop.
///
/// A hop that is not an address cannot be a trusted proxy, so the walk stops
/// there. If that hop is the nearest untrusted one (a trusted proxy reported
/// `for=unknown`, an obfuscated `_name` or garbage), the client is
/// unidentifiable: the key is `?` followed by the hop's bytes, escaped and
/// bounded to [`MAX_KEY_PART`](super::MAX_KEY_PART) bytes (a digest beyond),
/// see [`ClientAddr::Opaque`]. That key never is the proxy's own address nor
/// any client's address; clients a proxy reports alike (every `unknown`)
/// share it. If every hop is trusted, the leftmost one is the key; at most
/// 64 hops are examined, after which the 64th is the key.
///
/// Addresses are keyed as by [`PeerIp`] (IPv6 grouped by a prefix, the
/// transition forms listed there keyed as the IPv4 address they carry);
/// trust ranges match the address as written, IPv4-mapped addresses as
/// IPv4 (a NAT64, 6to4 or Teredo form of a trusted address is not
/// trusted).
///
/// ```
/// use std::net::SocketAddr;
/// use tower_throttle::key::{ClientIp, KeyExtractor, KeyWriter, RequestHead};
///
/// let client_ip = ClientIp::new().trust("10.0.0.0/8".parse()?);
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2")
///     .body(())?;
/// req.extensions_mut().insert("10.0.0.1:5000".parse::<SocketAddr>()?);
/// let mut key = Vec::new();
/// client_ip.extract(&RequestHead::new(&req), &mut KeyWriter::new(&mut key))?;
/// assert_eq!(key, b"203.0.113.7"); // not the spoofed 6.6.6.6
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ClientIp {
    trusted: Arc<[Cidr]>,
    header: ForwardedHeader,
    v6_prefix: u8,
    warnings: Arc<Warnings>,
}

impl ClientIp {
    /// The peer address until proxies are trusted; IPv6 grouped by /56.
    pub fn new() -> Self {
        ClientIp {
            trusted: Arc::new([]),
            header: ForwardedHeader::default(),
            v6_prefix: DEFAULT_IPV6_PREFIX,
            warnings: Arc::default(),
        }
    }

    /// Trusts proxies in `range` to report the address they received from.
    #[must_use]
    pub fn trust(self, range: Cidr) -> Self {
        self.trust_all([range])
    }

    /// Trusts proxies in every range of `ranges` (`ipnet` ranges through
    /// `.map(Cidr::from)`).
    ///
    /// Trusting a whole family (`0.0.0.0/0`, `::/0`) is logged as a warning:
    /// every client could then choose its key.
    #[must_use]
    pub fn trust_all(mut self, ranges: impl IntoIterator<Item = Cidr>) -> Self {
        let mut all = self.trusted.to_vec();
        let before = all.len();
        all.extend(ranges);
        warn_if_everything(&all[before..]);
        self.trusted = all.into();
        self
    }

    /// Which header the trusted proxies write (default `X-Forwarded-For`);
    /// read only from trusted peers.
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `bits` bits (128: no grouping).
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address of `req`, or `None` without a peer address or
    /// when the client is not identified by an address
    /// ([`ClientAddr::Opaque`]; see [`ClientIp::client`]).
    pub fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        match self.client(req)? {
            ClientAddr::Ip(ip) => Some(ip),
            ClientAddr::Opaque(_) => None,
        }
    }

    /// Whom `req` is charged to, or `None` without a peer address.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use tower_throttle::key::{ClientAddr, ClientIp, RequestHead};
    ///
    /// let client_ip = ClientIp::new().trust("10.0.0.0/8".parse()?);
    /// let mut req = http::Request::builder()
    ///     // The client wrote `\xff`; the proxy appended `unknown`.
    ///     .header("x-forwarded-for", http::HeaderValue::from_bytes(b"\xff, unknown")?)
    ///     .body(())?;
    /// req.extensions_mut().insert("10.0.0.1:5000".parse::<SocketAddr>()?);
    /// let head = RequestHead::new(&req);
    /// assert_eq!(client_ip.client(&head), Some(ClientAddr::Opaque(b"unknown")));
    /// assert_eq!(client_ip.client_ip(&head), None); // never the proxy, 10.0.0.1
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client<'a>(&self, req: &RequestHead<'a>) -> Option<ClientAddr<'a>> {
        let peer = peer_ip(req.extensions())?.to_canonical();
        if !self.is_trusted(peer) {
            if self.trusted.is_empty() {
                self.warnings.untrusted_forwarding(req.headers());
            }
            return Some(ClientAddr::Ip(peer));
        }
        let name = self.header.name();
        if !self.header.lists_hops() {
            // One address, set by the nearest proxy: its line is the last.
            let Some(line) = req.headers().get_all(&name).iter().next_back() else {
                self.warnings.unread_header(self.header, req.headers());
                return Some(ClientAddr::Ip(peer));
            };
            let node = line.as_bytes().trim_ascii();
            return Some(match parse_node(node) {
                Some(ip) => ClientAddr::Ip(ip.to_canonical()),
                None => ClientAddr::Opaque(unquote(node)),
            });
        }
        let forwarded = self.header == ForwardedHeader::Forwarded;
        let mut current = peer;
        let mut hops = 0;
        // Later header lines were appended by later hops: walk them backwards.
        for line in req.headers().get_all(name).iter().rev() {
            let line = line.as_bytes();
            let line_hops = if forwarded {
                Hops::forwarded(line)
            } else {
                Hops::xff(line)
            };
            for hop in line_hops {
                hops += 1;
                let node = if forwarded {
                    forwarded_for(hop).unwrap_or_default()
                } else {
                    hop
                };
                let Some(ip) = parse_node(node).map(|ip| ip.to_canonical()) else {
                    return Some(ClientAddr::Opaque(node));
                };
                if !self.is_trusted(ip) || hops >= MAX_HOPS {
                    return Some(ClientAddr::Ip(ip));
                }
                current = ip;
            }
        }
        if hops == 0 {
            self.warnings.unread_header(self.header, req.headers());
        }
        Some(ClientAddr::Ip(current))
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        match self.client(req).ok_or(NO_PEER)? {
            ClientAddr::Ip(ip) => write_ip(key.buf(), ip, self.v6_prefix),
            ClientAddr::Opaque(node) => {
                let start = key.buf().len();
                // No address key contains `?`: this namespace is nobody's.
                key.push_raw(b"?");
                key.push(node);
                bound_key_part(key.buf(), start, MAX_KEY_PART);
            }
        }
        Ok(())
    }
}
#[cfg(test)]
mod tests;
