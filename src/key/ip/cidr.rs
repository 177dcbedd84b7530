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
