use super::*;
use crate::config::{add_file, LoadOptions};

fn table(text: &str) -> Table {
    let mut t = Table::default();
    add_file(&mut t, "t.yaml", text, LoadOptions::default()).unwrap();
    t
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn find(t: &Table, domain: &str, pairs: &[(&str, &str)]) -> Option<Matched> {
    find_bytes(t, domain.as_bytes(), &entries(pairs))
}

fn find_bytes(t: &Table, domain: &[u8], e: &[(Vec<u8>, Vec<u8>)]) -> Option<Matched> {
    get_limit(
        t,
        domain,
        &Query {
            entries: e,
            override_limit: None,
        },
    )
    .unwrap()
}

const CONFIG: &str = "
domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: pre*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /a/*/c*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: outer
    descriptors:
      - key: inner
        rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn exact_then_wildcard_then_key_only() {
    let t = table(CONFIG);
    let rpu = |pairs: &[(&str, &str)]| find(&t, "d", pairs).map(|m| m.limit.requests_per_unit);
    assert_eq!(rpu(&[("k", "exact")]), Some(1));
    assert_eq!(rpu(&[("k", "prefix")]), Some(2));
    assert_eq!(rpu(&[("k", "pre")]), Some(2), "* matches nothing too");
    assert_eq!(rpu(&[("k", "other")]), Some(3));
    assert_eq!(rpu(&[("unknown", "x")]), None);
    assert!(find(&t, "nowhere", &[("k", "exact")]).is_none());
}

#[test]
fn a_limit_only_at_the_last_entry() {
    let t = table(CONFIG);
    assert!(
        find(&t, "d", &[("outer", "x")]).is_none(),
        "shorter than the config"
    );
    assert_eq!(
        find(&t, "d", &[("outer", "x"), ("inner", "y")])
            .unwrap()
            .limit
            .requests_per_unit,
        5
    );
    assert!(
        find(&t, "d", &[("outer", "x"), ("inner", "y"), ("more", "z")]).is_none(),
        "longer"
    );
    assert!(find(&t, "d", &[("k", "exact"), ("more", "z")]).is_none());
}

#[test]
fn middle_wildcards_and_share_threshold() {
    let t = table(CONFIG);
    let m = find(&t, "d", &[("path", "/a/b/c/d")]).unwrap();
    assert_eq!(m.limit.requests_per_unit, 4);
    assert_eq!(m.share, vec![Some("/a/*/c*".to_owned())]);
    assert_eq!(m.stats_key, "d.path_/a/*/c*");
    assert!(find(&t, "d", &[("path", "/a/b/d")]).is_none());
}

#[test]
fn wildcard_match_as_upstream() {
    let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
    assert!(wildcard_match(&parts("a*"), b"a"));
    assert!(wildcard_match(&parts("a*c*e"), b"abcde"));
    assert!(wildcard_match(&parts("a*c*e"), b"ace"));
    assert!(!wildcard_match(&parts("a*c*e"), b"abde"));
    assert!(
        !wildcard_match(&parts("ab*ba"), b"aba"),
        "prefix and suffix may not overlap"
    );
    assert!(wildcard_match(&parts("*"), b"anything"));
    assert!(wildcard_match(&parts("a**e"), b"ae"), "an empty part");
}

#[test]
fn wildcard_match_on_bytes_that_are_not_utf8() {
    let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
    assert!(wildcard_match(&parts("a*"), b"a\xff"));
    assert!(wildcard_match(&parts("*\u{e9}"), b"\xff\xc3\xa9"));
    assert!(wildcard_match(&parts("a*c*e"), b"a\xffc\xfee"));
    assert!(wildcard_match(&parts("a**e"), b"a\xffe"));
    assert!(!wildcard_match(&parts("a*c*e"), b"a\xff\xfee"));
    assert!(
        !wildcard_match(&parts("*\u{e9}"), b"\xc3"),
        "half a character is not the character"
    );
    assert!(!wildcard_match(&parts("\u{e9}"), b"\xc3"));
}

#[test]
fn bytes_that_are_not_utf8_match_as_bytes() {
    let t = table(CONFIG);
    let one = |k: &[u8], v: &[u8]| vec![(k.to_vec(), v.to_vec())];
    let rpu = |d: &[u8], e: Vec<(Vec<u8>, Vec<u8>)>| {
        find_bytes(&t, d, &e).map(|m| m.limit.requests_per_unit)
    };
    assert_eq!(rpu(b"d", one(b"k", b"pre\xff")), Some(2), "a wildcard");
    assert_eq!(rpu(b"d", one(b"k", b"\xff")), Some(3), "the key alone");
    assert_eq!(rpu(b"d", one(b"k\xff", b"exact")), None);
    assert_eq!(rpu(b"d\xff", one(b"k", b"exact")), None);
    let m = find_bytes(&t, b"d", &one(b"path", b"/a/\xff/c\xfe")).unwrap();
    assert_eq!(m.share, vec![Some("/a/*/c*".to_owned())]);
    assert_eq!(m.stats_key, "d.path_/a/*/c*");
}

#[test]
fn overrides_in_known_domains_only() {
    let t = table(CONFIG);
    let e = entries(&[("free", "x"), ("form", "")]);
    let q = Query {
        entries: &e,
        override_limit: Some((7, 2)),
    };
    let m = get_limit(&t, b"d", &q).unwrap().unwrap();
    assert_eq!(
        (m.limit.requests_per_unit, m.limit.unit),
        (7, Some(Unit::Minute))
    );
    assert_eq!(m.stats_key, "d.free_x.form");
    assert!(get_limit(&t, b"other", &q).unwrap().is_none());
    let bad = Query {
        entries: &e,
        override_limit: Some((7, 0)),
    };
    assert_eq!(get_limit(&t, b"d", &bad).unwrap_err(), BadOverrideUnit(0));
}

#[test]
fn value_to_metric_and_detailed_metric_keys() {
    let t = table(
        "domain: d\ndescriptors:\n  - key: user\n    value_to_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: ip\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(
        find(&t, "d", &[("user", "alice")]).unwrap().stats_key,
        "d.user_alice"
    );
    assert_eq!(find(&t, "d", &[("ip", "1")]).unwrap().stats_key, "d.ip_1");
}
