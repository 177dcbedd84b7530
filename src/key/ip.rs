//! Client addresses: the TCP peer, or the client behind trusted proxies.

use std::fmt;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::Extensions;

use super::{KeyExtractor, KeyWriter, MissingKey, RequestHead};

/// IPv6 clients are grouped by this prefix length by default: a /56 is what
/// one subscriber typically gets, so one user cannot rotate through 2⁷²
/// addresses to dodge a limit.
pub const DEFAULT_IPV6_PREFIX: u8 = 56;

/// At most this many hops of a forwarding header are examined.
const MAX_HOPS: usize = 64;

const NO_PEER: MissingKey = MissingKey::new(
    "the peer address is unknown (serve with axum's `into_make_service_with_connect_info::<SocketAddr>()` \
     or insert a `SocketAddr` request extension)",
);

/// The TCP peer's address, from axum's `ConnectInfo<SocketAddr>` (feature
/// `axum`) or a `SocketAddr` / `IpAddr` request extension.
///
/// IPv4-mapped IPv6 addresses count as IPv4; other IPv6 addresses are grouped
/// by their first [`DEFAULT_IPV6_PREFIX`] bits unless told otherwise.
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
    ext.get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| ext.get::<IpAddr>().copied())
}

/// Writes `ip` (canonical; IPv6 masked to `/v6_prefix`) without allocating.
pub(crate) fn write_ip(out: &mut Vec<u8>, ip: IpAddr, v6_prefix: u8) {
    // Writing to a Vec cannot fail.
    let _ = match ip.to_canonical() {
        IpAddr::V4(v4) => write!(out, "{v4}"),
        IpAddr::V6(v6) if v6_prefix >= 128 => write!(out, "{v6}"),
        IpAddr::V6(v6) => write!(out, "{}/{v6_prefix}", mask_v6(v6, v6_prefix)),
    };
}

fn mask_v4(ip: Ipv4Addr, bits: u8) -> Ipv4Addr {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(bits.min(32)))
        .unwrap_or(0);
    Ipv4Addr::from(u32::from(ip) & mask)
}

fn mask_v6(ip: Ipv6Addr, bits: u8) -> Ipv6Addr {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(bits.min(128)))
        .unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

/// An address range such as `10.0.0.0/8` or `fd00::/8`; a bare address is
/// a single host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// The range of `addr`'s first `bits` bits (host bits are cleared).
    pub fn new(addr: IpAddr, bits: u8) -> Result<Self, CidrError> {
        let addr = addr.to_canonical();
        let addr = match addr {
            IpAddr::V4(v4) if bits <= 32 => IpAddr::V4(mask_v4(v4, bits)),
            IpAddr::V6(v6) if bits <= 128 => IpAddr::V6(mask_v6(v6, bits)),
            _ => return Err(CidrError(format!("{addr}/{bits}: prefix too long"))),
        };
        Ok(Cidr { addr, bits })
    }

    /// True when `ip` (IPv4-mapped addresses as IPv4) is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.bits) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.bits) == net,
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let bad = || CidrError(format!("not an address range: {s:?}"));
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let bits = bits.unwrap_or(if addr.is_ipv4() { 32 } else { 128 });
        Cidr::new(addr, bits)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// A malformed [`Cidr`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CidrError {}

/// The header trusted proxies record the client in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`.
    Forwarded,
}

/// The client's address when the app runs behind proxies you trust.
///
/// Starting from the peer, while the current hop is a trusted proxy, the
/// forwarding header is read from the right: the first address that is not a
/// trusted proxy is the client. Entries left of it were written by the client
/// itself and are ignored, so a spoofed `X-Forwarded-For` cannot change the
/// key. With no trusted proxy configured, only the peer address is used. If
/// a trusted hop recorded something unparsable (`unknown`, an obfuscated
/// name), or every hop is trusted, the last address reached is the key.
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
}

impl ClientIp {
    /// The peer address until proxies are trusted; IPv6 grouped by /56.
    pub fn new() -> Self {
        ClientIp {
            trusted: Arc::new([]),
            header: ForwardedHeader::default(),
            v6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Trusts proxies in `range` to report the address they received from.
    pub fn trust(self, range: Cidr) -> Self {
        self.trust_all([range])
    }

    /// Trusts proxies in every range of `ranges`.
    pub fn trust_all(mut self, ranges: impl IntoIterator<Item = Cidr>) -> Self {
        let mut all = self.trusted.to_vec();
        all.extend(ranges);
        self.trusted = all.into();
        self
    }

    /// Which header the trusted proxies write (default `X-Forwarded-For`).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by their first `bits` bits (128: no grouping).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.v6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|c| c.contains(ip))
    }

    /// The client address of `req`, or `None` without a peer address.
    pub fn client_ip(&self, req: &RequestHead<'_>) -> Option<IpAddr> {
        let peer = peer_ip(req.extensions())?.to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let name: HeaderName = match self.header {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
        };
        let mut current = peer;
        let mut hops = 0;
        // Later header lines were appended by later hops: walk them backwards.
        for value in req.headers().get_all(name).iter().rev() {
            let Ok(value) = value.to_str() else {
                return Some(current);
            };
            for entry in value.rsplit(',').map(str::trim).filter(|e| !e.is_empty()) {
                hops += 1;
                let parsed = match self.header {
                    ForwardedHeader::XForwardedFor => parse_node(entry),
                    ForwardedHeader::Forwarded => forwarded_for(entry).and_then(parse_node),
                };
                let Some(ip) = parsed.map(|ip| ip.to_canonical()) else {
                    return Some(current);
                };
                if !self.is_trusted(ip) || hops >= MAX_HOPS {
                    return Some(ip);
                }
                current = ip;
            }
        }
        Some(current)
    }
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &RequestHead<'_>, key: &mut KeyWriter<'_>) -> Result<(), MissingKey> {
        let ip = self.client_ip(req).ok_or(NO_PEER)?;
        write_ip(key.buf(), ip, self.v6_prefix);
        Ok(())
    }
}

/// The `for=` parameter of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then_some(value.trim())
    })
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`, optionally quoted.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    let node = node
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(node);
    if let Some(rest) = node.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port_ok = after.is_empty() || after.strip_prefix(':').is_some();
        return port_ok.then(|| inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6))?;
    }
    node.parse::<IpAddr>()
        .ok()
        .or_else(|| node.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

#[cfg(test)]
mod tests;
