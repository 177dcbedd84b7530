//! IPv6 transition addresses that carry the client's IPv4 address.

use std::net::{Ipv4Addr, Ipv6Addr};

/// The IPv4 address of the client behind `ip`, when `ip` is a transition
/// address that carries one; `None` for every other IPv6 address.
///
/// The forms, each recognised by its exact prefix:
///
/// | form | prefix | the client's IPv4 address |
/// | --- | --- | --- |
/// | IPv4-compatible (RFC 4291 §2.5.5.1, deprecated) | `::/96`, except `::` and `::1` | bits 96–127 |
/// | IPv4-mapped (RFC 4291 §2.5.5.2) | `::ffff:0:0/96` | bits 96–127 |
/// | IPv4-translated, SIIT (RFC 2765 §2.1, obsoleted by RFC 6145) | `::ffff:0:0:0/96` | bits 96–127 |
/// | NAT64 well-known prefix (RFC 6052 §2.1) | `64:ff9b::/96` | bits 96–127 |
/// | NAT64 local-use prefix (RFC 8215) | `64:ff9b:1::/48` | bits 96–127 (see below) |
/// | 6to4 (RFC 3056 §2) | `2002::/16` | bits 16–47 (`2002:V4ADDR::/48`) |
/// | Teredo (RFC 4380 §4) | `2001:0::/32` exactly | bits 96–127, inverted |
///
/// `::` and `::1` are the unspecified and loopback addresses, not clients.
/// Inside `64:ff9b:1::/48` the operator picks an RFC 6052 prefix length;
/// the IPv4 address is read where a /96 prefix puts it, the common
/// deployment ([`PeerIp`](super::PeerIp) says what a shorter one costs).
///
/// Only prefixes a client cannot assign itself are read: no network is
/// given addresses in them, and a Teredo or 6to4 address is reached through
/// the IPv4 address it carries, so claiming another's takes being there. Forms known only by their interface identifier
/// (ISATAP's `…:5efe:a.b.c.d`) are not read: a host picks its own.
pub(super) const fn embedded_client_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    const NAT64: u32 = 0x0064_ff9b;
    const TEREDO: u32 = 0x2001_0000;
    const SIX_TO_FOUR: u32 = 0x2002;
    let bits = ip.to_bits();
    let first32 = (bits >> 96) as u32;
    let middle64 = (bits >> 32) as u64;
    let last32 = bits as u32;
    let v4 = match (first32, middle64) {
        (0, 0) if last32 > 1 => last32,
        (0, 0xffff | 0xffff_0000) => last32,
        (NAT64, 0) => last32,
        // 64:ff9b:1::/48: bits 32–47 are 1, bits 48–95 the operator's.
        (NAT64, m) if m >> 48 == 1 => last32,
        // The Teredo client's IPv4 address is stored with every bit flipped.
        (TEREDO, _) => !last32,
        (f, _) if f >> 16 == SIX_TO_FOUR => (bits >> 80) as u32,
        _ => return None,
    };
    Some(Ipv4Addr::from_bits(v4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn embedded(s: &str) -> Option<String> {
        embedded_client_ipv4(s.parse().unwrap()).map(|v4| v4.to_string())
    }

    #[test]
    fn every_form_yields_its_ipv4_address() {
        for (v6, v4) in [
            // IPv4-compatible.
            ("::192.0.2.1", "192.0.2.1"),
            ("::0.0.0.2", "0.0.0.2"),
            // IPv4-mapped.
            ("::ffff:192.0.2.1", "192.0.2.1"),
            ("::ffff:0.0.0.0", "0.0.0.0"),
            // IPv4-translated: the two addresses of the attack run.
            ("::ffff:0:192.0.2.1", "192.0.2.1"),
            ("::ffff:0:198.51.100.7", "198.51.100.7"),
            // NAT64, well-known and local-use.
            ("64:ff9b::192.0.2.1", "192.0.2.1"),
            ("64:ff9b::c000:201", "192.0.2.1"),
            ("64:ff9b:1::192.0.2.1", "192.0.2.1"),
            ("64:ff9b:1:abcd:1::192.0.2.1", "192.0.2.1"),
            // 6to4: 2002:c000:0201::/48 is 192.0.2.1's site.
            ("2002:c000:201::1", "192.0.2.1"),
            ("2002:c000:201:ffff:1:2:3:4", "192.0.2.1"),
            ("2002:cb00:7107::", "203.0.113.7"),
            ("2002::", "0.0.0.0"),
            ("2002:ffff:ffff:ffff::", "255.255.255.255"),
            // Teredo: the commonly cited example (client 192.0.2.45, port
            // 40000, server 65.54.227.120), then other servers, flags and
            // ports: the same client.
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
            ("2001:0:4136:e300:0:0:3fff:fdd2", "192.0.2.45"),
            ("2001:0:ffff:ffff:ffff:ffff:3fff:fdd2", "192.0.2.45"),
            ("2001::ffff:ffff", "0.0.0.0"),
            ("2001::", "255.255.255.255"),
        ] {
            assert_eq!(embedded(v6).as_deref(), Some(v4), "{v6}");
        }
    }

    #[test]
    fn look_alikes_outside_the_prefixes_carry_nothing() {
        for v6 in [
            "::",
            "::1",
            // One bit off the ::/96 forms.
            "::1:0:192.0.2.1",
            "::fffe:192.0.2.1",
            "::fffe:0:192.0.2.1",
            "::1:ffff:0:192.0.2.1",
            "1::ffff:192.0.2.1",
            // Neighbours of the NAT64 prefixes.
            "64:ff9b::1:192.0.2.1",
            "64:ff9b:2::192.0.2.1",
            "64:ff9a::192.0.2.1",
            "65:ff9b::192.0.2.1",
            // 2001::/23 holds more than Teredo: documentation, ORCHIDv2,
            // AMT, benchmarking, AS112.
            "2001:db8::3fff:fdd2",
            "2001:1::3fff:fdd2",
            "2001:2::3fff:fdd2",
            "2001:3::3fff:fdd2",
            "2001:20::3fff:fdd2",
            "2001:4:112::3fff:fdd2",
            // Neighbours of 2002::/16, and ISATAP's interface identifier.
            "2003:c000:201::1",
            "2001:c000:201::1",
            "2a00::5efe:192.0.2.1",
            "fe80::5efe:192.0.2.1",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ] {
            assert_eq!(embedded(v6), None, "{v6}");
        }
    }
}
