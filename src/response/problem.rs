//! RFC 9457 problem documents (`application/problem+json`), the body of
//! [`problem_json_body`](crate::ThrottleLayer::problem_json_body).

use std::fmt::Write as _;

use super::Rejection;

/// The problem type of a 429: the draft's `quota-exceeded` (section 5.1 of
/// draft-ietf-httpapi-ratelimit-headers-11, registered with the title
/// "Quota Exceeded"), with the extension member `violated-policies`, the
/// names of the rules that denied.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The problem document of `rejection`. A 429 is a `quota-exceeded`
/// naming its denying rules; every other rejection is `about:blank` with
/// the status's reason as title (RFC 9457, section 4.2.1).
pub(super) fn problem_json(rejection: &Rejection<'_>) -> String {
    let status = rejection.status();
    let mut s = String::with_capacity(192);
    s.push_str("{\"type\":");
    match rejection {
        Rejection::Limited(_) => {
            json_string(&mut s, QUOTA_EXCEEDED);
            s.push_str(",\"title\":\"Quota Exceeded\"");
        }
        _ => {
            s.push_str("\"about:blank\",\"title\":");
            json_string(&mut s, status.canonical_reason().unwrap_or("Error"));
        }
    }
    let _ = write!(s, ",\"status\":{},\"detail\":", status.as_u16());
    json_string(&mut s, &rejection.to_string());
    if let Rejection::Limited(info) = rejection {
        s.push_str(",\"violated-policies\":[");
        let denied = info.iter().filter(|(_, _, d)| !d.allowed);
        for (i, (name, _, _)) in denied.enumerate() {
            if i > 0 {
                s.push(',');
            }
            json_string(&mut s, name);
        }
        s.push(']');
    }
    s.push('}');
    s
}

fn json_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_escaping() {
        let mut s = String::new();
        super::json_string(&mut s, "a\"b\\c\n");
        assert_eq!(s, "\"a\\\"b\\\\c\\u000a\"");
    }
}
