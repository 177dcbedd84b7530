use super::*;

fn load(text: &str) -> Result<Table, ConfigError> {
    load_with(text, LoadOptions::default())
}

fn load_with(text: &str, options: LoadOptions) -> Result<Table, ConfigError> {
    let mut table = Table::default();
    add_file(&mut table, "config/test.yaml", text, options)?;
    Ok(table)
}

fn error(text: &str) -> ConfigError {
    load(text).expect_err("the file must be refused")
}

/// Upstream README's example 2 (messaging), as written there.
const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[test]
fn upstream_example_loads_and_dumps_in_upstream_format() {
    let t = load(MESSAGING).unwrap();
    assert_eq!(
        t.dump(),
        "messaging.message_type_marketing.to_number: unit=DAY requests_per_unit=5, shadow_mode: false, quota_mode: false\n\
         messaging.to_number: unit=DAY requests_per_unit=100, shadow_mode: false, quota_mode: false\n"
    );
}

#[test]
fn unknown_keys_are_refused_with_file_line_and_field() {
    let e = error("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      bogus: 1\n");
    assert_eq!(e.message, "config error, unknown key 'bogus'");
    assert_eq!(e.file, "config/test.yaml");
    assert_eq!(e.field.as_deref(), Some("descriptors[0].rate_limit"));
    assert_eq!(e.line, Some((7, 7)), "the key's own line: {e}");
    assert!(
        e.to_string()
            .starts_with("config/test.yaml:7:7: descriptors[0].rate_limit: "),
        "{e}"
    );
    let e = error("domain: d\nbogus: 1\n");
    assert_eq!(e.message, "config error, unknown key 'bogus'");
}

#[test]
fn metadata_is_free_but_everything_else_is_checked() {
    load("domain: d\ndescriptors:\n  - key: a\n    metadata:\n      anything: [1, {x: 2}]\n")
        .unwrap();
    // A known key out of place is ignored, as upstream does, but its
    // contents are still checked.
    load("domain: d\nunit: second\n").unwrap();
    let e = error("domain: d\nunit: {nope: 1}\n");
    assert_eq!(e.message, "config error, unknown key 'nope'");
    let e = error("domain: d\ndescriptors:\n  - 3\n");
    assert!(
        e.message
            .starts_with("config error, yaml file contains list of type other than map"),
        "{e}"
    );
    let e = error("domain: d\ndescriptors:\n  - key: a\n    1: x\n");
    assert_eq!(e.message, "config error, key is not of type string: 1");
}

#[test]
fn every_upstream_load_error_in_upstream_words() {
    let cases = [
        ("descriptors: []\n", "config file cannot have empty domain"),
        ("domain: d\ndescriptors:\n  - value: v\n", "descriptor has empty key"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n",
            "duplicate descriptor composite key 'a_b'",
        ),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
        ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values (containing '*'), but found key 'a_b'",
        ),
    ];
    for (text, message) in cases {
        let e = error(text);
        assert_eq!(e.message, message, "{text}");
        assert!(e.line.is_some(), "no line for {e}");
    }
    let e = error("domain: d\ndescriptors: [\n");
    assert!(e.line.is_some(), "{e}");
}

#[test]
fn requests_per_unit_is_a_uint32() {
    let text = |n: &str| {
        format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: {n}}}\n")
    };
    load(&text("4294967295")).unwrap();
    for bad in ["4294967296", "-1", "1.5", "many"] {
        assert!(load(&text(bad)).is_err(), "{bad}");
    }
}

#[test]
fn duplicate_domains_unless_merged() {
    let mut t = Table::default();
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    add_file(&mut t, "config/a.yaml", a, LoadOptions::default()).unwrap();
    let e = add_file(&mut t, "config/b.yaml", b, LoadOptions::default()).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.message.as_str()),
        ("config/b.yaml", "duplicate domain 'd' in config file")
    );
    assert_eq!(e.line, Some((1, 1)));
    let merge = LoadOptions {
        merge_domains: true,
        ..LoadOptions::default()
    };
    add_file(&mut t, "config/b.yaml", b, merge).unwrap();
    assert_eq!(t.dump().lines().count(), 2);
    let e = add_file(&mut t, "config/c.yaml", b, merge).unwrap_err();
    assert_eq!(e.message, "duplicate descriptor composite key 'd.b'");
}

#[test]
fn extension_keys_inside_rate_limit() {
    let t = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 10}\n").unwrap();
    assert!(t.dump().ends_with(", algorithm: gcra\n"), "{}", t.dump());
    for (text, message) in [
        ("algorithm: sliding_log, burst: 1", "max_burst applies only to algorithm: gcra"),
        ("algorithm: sliding_log, max_burst: 1", "max_burst applies only to algorithm: gcra"),
        ("algorithm: gcra, max_burst: 1, burst: 1", "write `max_burst` alone (`burst` is its older spelling)"),
        ("algorithm: leaky", "unknown algorithm 'leaky' (expected fixed_window, sliding_window, sliding_log or gcra)"),
        ("concurrency: 5", "concurrency cannot be expressed in the rate-limit protocol (it has no release call)"),
    ] {
        let e = error(&format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: minute, requests_per_unit: 60, {text}}}\n"));
        assert_eq!(e.message, message);
    }
    let e = error("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 0, algorithm: gcra}\n");
    assert!(e.message.starts_with("algorithm gcra:"), "{e}");
    // Outside rate_limit they are unknown, as upstream says.
    assert_eq!(
        error("domain: d\ndescriptors:\n  - key: a\n    algorithm: gcra\n").message,
        "config error, unknown key 'algorithm'"
    );
}

#[test]
fn strict_mode_refuses_the_extension_as_upstream_would() {
    let strict = LoadOptions {
        strict_upstream_keys: true,
        ..LoadOptions::default()
    };
    let e = load_with("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: gcra}\n", strict).unwrap_err();
    assert_eq!(e.message, "config error, unknown key 'algorithm'");
    load_with(MESSAGING, strict).unwrap();
}

#[test]
fn load_dir_reads_yaml_files_in_name_order() {
    let dir = std::env::temp_dir().join(format!("rls-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b.yaml"), MESSAGING).unwrap();
    std::fs::write(dir.join("notes.txt"), "not: [config").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "domain: hidden\n").unwrap();
    let t = load_dir(&dir, LoadOptions::default()).unwrap();
    assert!(t.domains.contains_key("messaging") && t.domains.contains_key("hidden"));
    let ignore = LoadOptions {
        ignore_dotfiles: true,
        ..LoadOptions::default()
    };
    assert!(!load_dir(&dir, ignore)
        .unwrap()
        .domains
        .contains_key("hidden"));
    std::fs::write(dir.join("a.yaml"), "domain: x\ndescriptors:\n  - key: ''\n").unwrap();
    let e = load_dir(&dir, LoadOptions::default()).unwrap_err();
    assert!(e.file.ends_with("/a.yaml"), "{e}");
    assert!(load_dir(&dir.join("missing"), LoadOptions::default())
        .unwrap()
        .is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
