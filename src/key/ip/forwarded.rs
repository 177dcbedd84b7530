//! Forwarding headers parsed as bytes, hop by hop, from the right.
//!
//! Nothing here decodes a whole header value: a byte that is not ASCII (or
//! not UTF-8) only spoils the hop it sits in, so bytes a client writes on the
//! left cannot change how the hops its proxies appended on the right are read.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The hops of one header line, nearest (rightmost) first, OWS-trimmed;
/// empty hops are skipped.
pub(super) enum Hops<'a> {
    /// `X-Forwarded-For`: comma-separated nodes.
    Xff(std::slice::RSplit<'a, u8, fn(&u8) -> bool>),
    /// `Forwarded`: comma-separated elements, commas inside quoted strings
    /// included in their element.
    Forwarded(Option<&'a [u8]>),
}

impl<'a> Hops<'a> {
    pub(super) fn xff(line: &'a [u8]) -> Self {
        let comma: fn(&u8) -> bool = |b| *b == b',';
        Hops::Xff(line.rsplit(comma))
    }

    pub(super) fn forwarded(line: &'a [u8]) -> Self {
        Hops::Forwarded(Some(line))
    }
}

impl<'a> Iterator for Hops<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        loop {
            let hop = match self {
                Hops::Xff(split) => split.next()?,
                Hops::Forwarded(rest) => {
                    let line = rest.take()?;
                    let (before, element) = split_last_element(line);
                    *rest = before;
                    element
                }
            };
            let hop = hop.trim_ascii();
            if !hop.is_empty() {
                return Some(hop);
            }
        }
    }
}

/// Splits `line` at its last comma outside a quoted string: what is left of
/// it (`None` when there is no such comma) and the last element.
///
/// Scanning from the right means a quote a client left open on the left
/// cannot swallow the elements its proxies appended: the trusted part is
/// read before the scan ever reaches client bytes.
fn split_last_element(line: &[u8]) -> (Option<&[u8]>, &[u8]) {
    let mut in_quotes = false;
    let mut i = line.len();
    while i > 0 {
        i -= 1;
        match line[i] {
            b'"' if !in_quotes => in_quotes = true,
            // Inside a quoted string, `"` after an odd run of `\` is a
            // quoted-pair, not the opening quote.
            b'"' => in_quotes = backslashes_before(line, i) % 2 == 1,
            b',' if !in_quotes => return (Some(&line[..i]), &line[i + 1..]),
            _ => {}
        }
    }
    (None, line)
}

fn backslashes_before(line: &[u8], i: usize) -> usize {
    line[..i].iter().rev().take_while(|&&b| b == b'\\').count()
}

/// The value of the `for` parameter of one `Forwarded` element (the first
/// one), its quotes removed; `None` when the element has none.
pub(super) fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    let mut rest = element;
    while !rest.is_empty() {
        let end = pair_end(rest);
        let pair = &rest[..end];
        rest = rest.get(end + 1..).unwrap_or_default();
        let Some(eq) = pair.iter().position(|&b| b == b'=') else {
            continue;
        };
        if pair[..eq].trim_ascii().eq_ignore_ascii_case(b"for") {
            return Some(unquote(pair[eq + 1..].trim_ascii()));
        }
    }
    None
}

/// The index of the `;` ending the first pair of `s` (outside quotes), or
/// `s.len()`.
fn pair_end(s: &[u8]) -> usize {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, &b) in s.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if in_quotes => escaped = true,
            b'"' => in_quotes = !in_quotes,
            b';' if !in_quotes => return i,
            _ => {}
        }
    }
    s.len()
}

/// `"x"` → `x`; anything else unchanged. Quoted-pairs are kept as written:
/// a node identifier is compared, never decoded.
pub(super) fn unquote(value: &[u8]) -> &[u8] {
    match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    }
}

/// A node: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`
/// (ports may be RFC 7239 obfuscated ports, `_abc`), optionally quoted.
/// Anything else (`unknown`, `_hidden`, bytes that are not UTF-8, a zone id,
/// a bad port) is `None`.
pub(super) fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let node = std::str::from_utf8(unquote(node.trim_ascii())).ok()?;
    if let Some(rest) = node.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !after.is_empty() && !after.strip_prefix(':').is_some_and(valid_port) {
            return None;
        }
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    // Only IPv4 takes an unbracketed port: `2001:db8::1:80` is an address.
    let (host, port) = node.split_once(':')?;
    if !valid_port(port) {
        return None;
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A decimal port (0–65535) or an RFC 7239 obfuscated port (`_` then
/// ALPHA / DIGIT / `.` / `_` / `-`).
fn valid_port(port: &str) -> bool {
    match port.as_bytes() {
        [b'_', rest @ ..] => {
            !rest.is_empty()
                && rest
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        digits => {
            (1..=5).contains(&digits.len())
                && digits.iter().all(u8::is_ascii_digit)
                && port.parse::<u16>().is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(line: &[u8]) -> Vec<&[u8]> {
        Hops::forwarded(line).collect()
    }

    #[test]
    fn xff_hops_come_nearest_first_and_empty_hops_are_skipped() {
        let hops: Vec<&[u8]> = Hops::xff(b" 1.1.1.1 ,, \t,2.2.2.2:80,\xff ").collect();
        assert_eq!(hops, [&b"\xff"[..], b"2.2.2.2:80", b"1.1.1.1"]);
        assert_eq!(Hops::xff(b"").count(), 0);
        assert_eq!(Hops::xff(b" , ").count(), 0);
    }

    #[test]
    fn forwarded_elements_respect_quoted_strings() {
        let line = br#"for=1.1.1.1;host="a,b", for="[2001:db8::1]:4711";by="x\",y", for=3.3.3.3"#;
        assert_eq!(
            forwarded(line),
            [
                &b"for=3.3.3.3"[..],
                br#"for="[2001:db8::1]:4711";by="x\",y""#,
                br#"for=1.1.1.1;host="a,b""#,
            ]
        );
        // An escaped backslash before the closing quote closes it.
        assert_eq!(
            forwarded(br#"host="a\\", for=2.2.2.2"#),
            [&b"for=2.2.2.2"[..], br#"host="a\\""#]
        );
        // A quote left open on the left does not swallow the right.
        assert_eq!(
            forwarded(br#"for="6.6.6.6, for=1.2.3.4"#),
            [&b"for=1.2.3.4"[..], br#"for="6.6.6.6"#]
        );
        assert_eq!(forwarded(b" , ,"), Vec::<&[u8]>::new());
    }

    #[test]
    fn the_for_parameter_is_found_outside_quotes() {
        assert_eq!(forwarded_for(b"for=1.2.3.4"), Some(&b"1.2.3.4"[..]));
        assert_eq!(
            forwarded_for(br#"proto=https; For = "[::1]:80" ;by=x"#),
            Some(&b"[::1]:80"[..])
        );
        assert_eq!(
            forwarded_for(br#"host="x;for=6.6.6.6";for=1.2.3.4"#),
            Some(&b"1.2.3.4"[..])
        );
        assert_eq!(forwarded_for(b"proto=https;by=1.2.3.4"), None);
        assert_eq!(forwarded_for(b"for"), None);
        assert_eq!(forwarded_for(b"for=_hidden"), Some(&b"_hidden"[..]));
        assert_eq!(forwarded_for(b"for=\"\xff\""), Some(&b"\xff"[..]));
    }

    #[test]
    fn nodes_with_and_without_ports() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        for (node, want) in [
            (&b"1.2.3.4"[..], ip("1.2.3.4")),
            (b"1.2.3.4:5678", ip("1.2.3.4")),
            (b"1.2.3.4:_obf", ip("1.2.3.4")),
            (b"\"1.2.3.4\"", ip("1.2.3.4")),
            (b"2001:db8::1", ip("2001:db8::1")),
            (b"[2001:db8::1]", ip("2001:db8::1")),
            (b"[::1]:80", ip("::1")),
            (b"[2001:db8::1]:_x-1.y", ip("2001:db8::1")),
            (b"::ffff:1.2.3.4", ip("::ffff:1.2.3.4")),
            (b"1.2.3.4:", None),
            (b"1.2.3.4:65536", None),
            (b"1.2.3.4:+80", None),
            (b"1.2.3.4:_", None),
            (b"[::1]:", None),
            (b"[::1]x", None),
            (b"[1.2.3.4]", None),
            (b"[::1", None),
            (b"2001:db8::1:80:x", None),
            (b"fe80::1%eth0", None),
            (b"unknown", None),
            (b"_hidden", None),
            (b"1.2.3.4\xff", None),
            (b"\xc3\xa9", None),
            (b"", None),
        ] {
            assert_eq!(
                parse_node(node),
                want,
                "{:?}",
                String::from_utf8_lossy(node)
            );
        }
    }
}
