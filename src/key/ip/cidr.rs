//! Address ranges, for the proxies `ClientIp` trusts.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

pub(super) fn mask_v4(ip: Ipv4Addr, bits: u8) -> Ipv4Addr {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(bits.min(32)))
        .unwrap_or(0);
    Ipv4Addr::from(u32::from(ip) & mask)
}

pub(super) fn mask_v6(ip: Ipv6Addr, bits: u8) -> Ipv6Addr {
    let mask = u128::MAX
        .checked_shl(128 - u32::from(bits.min(128)))
        .unwrap_or(0);
    Ipv6Addr::from(u128::from(ip) & mask)
}

/// An address range such as `10.0.0.0/8` or `fd00::/8`; a bare address is
/// a single host.
///
/// Converts to and from [`ipnet::IpNet`] (and its `Ipv4Net` / `Ipv6Net`),
/// so ranges already held as `ipnet` values can be trusted as they are:
///
/// ```
/// use tower_throttle::key::Cidr;
///
/// let net: ipnet::IpNet = "10.0.0.0/8".parse()?;
/// let cidr = Cidr::from(net);
/// assert_eq!(cidr, "10.0.0.0/8".parse()?);
/// assert_eq!(ipnet::IpNet::from(cidr), net);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// The range of `addr`'s first `bits` bits (host bits are cleared).
    ///
    /// An IPv4-mapped range (`::ffff:10.0.0.0/104`) is its IPv4 range
    /// (`10.0.0.0/8`), as addresses are matched; one wider than the mapped
    /// block (`/96`) stays IPv6.
    pub fn new(addr: IpAddr, bits: u8) -> Result<Self, CidrError> {
        let addr = match addr {
            IpAddr::V6(v6) if (96..=128).contains(&bits) => match v6.to_ipv4_mapped() {
                Some(v4) => return Cidr::new(IpAddr::V4(v4), bits - 96),
                None => addr,
            },
            _ => addr,
        };
        let addr = match addr {
            IpAddr::V4(v4) if bits <= 32 => IpAddr::V4(mask_v4(v4, bits)),
            IpAddr::V6(v6) if bits <= 128 => IpAddr::V6(mask_v6(v6, bits)),
            _ => return Err(CidrError(format!("{addr}/{bits}: prefix too long"))),
        };
        Ok(Cidr { addr, bits })
    }

    /// The range's first address (host bits cleared).
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The number of leading bits the range fixes.
    pub fn prefix_len(&self) -> u8 {
        self.bits
    }

    /// True when `ip` (IPv4-mapped addresses as IPv4) is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.bits) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.bits) == net,
            // A range wider than the mapped block holds mapped addresses too.
            (IpAddr::V6(net), IpAddr::V4(v4)) => mask_v6(v4.to_ipv6_mapped(), self.bits) == net,
            _ => false,
        }
    }
}

impl From<ipnet::IpNet> for Cidr {
    fn from(net: ipnet::IpNet) -> Self {
        // An `IpNet`'s prefix always fits its family.
        Cidr::new(net.addr(), net.prefix_len()).unwrap_or(Cidr {
            addr: net.network(),
            bits: net.prefix_len(),
        })
    }
}

impl From<ipnet::Ipv4Net> for Cidr {
    fn from(net: ipnet::Ipv4Net) -> Self {
        ipnet::IpNet::V4(net).into()
    }
}

impl From<ipnet::Ipv6Net> for Cidr {
    fn from(net: ipnet::Ipv6Net) -> Self {
        ipnet::IpNet::V6(net).into()
    }
}

impl From<Cidr> for ipnet::IpNet {
    fn from(cidr: Cidr) -> Self {
        // A `Cidr`'s prefix always fits its family: `new` checked it.
        match cidr.addr {
            IpAddr::V4(v4) => ipnet::Ipv4Net::new(v4, cidr.bits)
                .map(ipnet::IpNet::V4)
                .unwrap_or_default(),
            IpAddr::V6(v6) => ipnet::Ipv6Net::new(v6, cidr.bits)
                .map(ipnet::IpNet::V6)
                .unwrap_or_default(),
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
