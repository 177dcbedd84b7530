//! The answer's fields and bodies as in code; values a file controls refused at their edges.

use super::{ask, code, extractors, frozen, same_answers, UserId, RULE};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{LayerConfig, RuleTable};
use tower_throttle::key::FromExtension;
use tower_throttle::response::{FieldProfile, ResetFormat};
use tower_throttle::{MemoryStore, ThrottleLayer};

/// The answer's fields and body: draft 10, legacy headers with Unix
/// timestamps... each as in code.
#[tokio::test]
async fn fields_and_bodies_match_code() {
    let user = || FromExtension::<UserId>::new();
    let cases: Vec<(&str, ThrottleLayer<MemoryStore<ManualClock>>)> = vec![
        (
            "field_profile: draft10\nheaders_on_allowed: true",
            code(user())
                .field_profile(FieldProfile::Draft10)
                .headers_on_allowed(true),
        ),
        (
            "legacy_headers: true\nietf_headers: false",
            code(user()).legacy_headers(true).ietf_headers(false),
        ),
        (
            "legacy_headers: true\nlegacy_reset_format: seconds",
            code(user())
                .legacy_headers(true)
                .legacy_reset_format(ResetFormat::Seconds),
        ),
        ("body: problem_json", code(user()).problem_json_body()),
        (
            "body: plain_text\nmode: dry_run",
            code(user()).plain_text_body().dry_run(),
        ),
    ];
    for (head, layer) in cases {
        let file = format!("key: {{ extractor: user_id }}\n{head}\n{RULE}");
        same_answers(&file, layer, &[ask("/r"), ask("/r"), ask("/r")]).await;
    }
}

/// Values a file controls, refused at their edges with the field named.
#[test]
fn bad_values_are_refused_naming_the_field() {
    let refused = [
        ("count_if: { http: [99] }", "count_if.http[0]"),
        ("count_if: { http: [6xx] }", "count_if.http[0]"),
        ("count_if: { grpc: [17] }", "count_if.grpc[0]"),
        ("count_if: { grpc: [not_a_code] }", "count_if.grpc[0]"),
        ("skip: { paths: [healthz] }", "skip.paths"),
        ("skip: { methods: ['BAD METHOD'] }", "skip.methods"),
        ("on_missing_key: { reject: 200 }", "on_missing_key.reject"),
        ("near_limit_ratio: 1.5", "near_limit_ratio"),
        ("near_limit_ratio: -0.1", "near_limit_ratio"),
        ("near_limit_ratio: .nan", "near_limit_ratio"),
        ("store_timeout: 0ms", "store_timeout"),
        ("store_timeout: 0s", "store_timeout"),
        ("store_timeout: 99999999999999999d", "store_timeout"),
        ("field_profile: draft12", "field_profile"),
        ("body: html", "body"),
    ];
    for (line, field) in refused {
        let text = format!("{line}\n{RULE}");
        let e = LayerConfig::parse("l.yaml", &text).unwrap_err();
        assert!(
            e.field.as_deref().is_some_and(|f| f.starts_with(field)),
            "{line}: {e}"
        );
    }
    // Their edges inside the range load.
    for line in [
        "near_limit_ratio: 0",
        "near_limit_ratio: 1",
        "store_timeout: 1ms",
    ] {
        let text = format!("{line}\n{RULE}");
        assert!(LayerConfig::parse("l.yaml", &text).is_ok(), "{line}");
    }
    let rule = |extra: &str| {
        format!("rules: [{{ name: r, policy: {{ fixed_window: {{ limit: 2, window: 60s }} }}, {extra} }}]")
    };
    for (extra, field) in [
        ("cost: { header: 'x y', default: 1 }", "rules[0].cost"),
        ("cost: { default: 1 }", "rules[0].cost"),
        (
            "cost: { header: x-a, query: q, default: 1 }",
            "rules[0].cost",
        ),
        ("cost: -1", "rules[0].cost"),
        ("settle: { trailer: 'no good' }", "rules[0].settle"),
        ("quota_unit: bytes", "rules[0].quota_unit"),
    ] {
        let e = LayerConfig::parse("l.yaml", &rule(extra)).unwrap_err();
        assert!(
            e.field.as_deref().is_some_and(|f| f.starts_with(field)),
            "{extra}: {e}"
        );
    }
    // An extractor the application did not register: refused at load, not
    // at the first request.
    let text = format!("key: {{ extractor: tenant }}\n{RULE}");
    let config = LayerConfig::parse("l.yaml", &text).unwrap();
    let e = RuleTable::with_extractors(frozen(), config, extractors()).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("key"), "{e}");
    assert!(e.message.contains("registered: plan, user_id"), "{e}");
    let text = "rules: [{ name: r, policy: { fixed_window: { limit: 2, window: 60s } }, tiers: { by: { extractor: tier }, policies: {} } }]";
    let e = LayerConfig::parse("l.yaml", text)
        .unwrap()
        .layer(frozen())
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("rules[0].tiers.by"), "{e}");
}
