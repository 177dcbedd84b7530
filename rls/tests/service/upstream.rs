//! Upstream's answers: the README's examples and the counting surprises
//! of its source, through a tonic client, on the memory store.

use crate::support::*;

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

#[tokio::test]
async fn readme_example_2_nested_and_multiple_descriptors() {
    let mut rls = Rls::start(&[("messaging.yaml", MESSAGING)], &[]).await;
    let both = || {
        vec![
            d(&[("message_type", "marketing"), ("to_number", "2061111111")]),
            d(&[("to_number", "2061111111")]),
        ]
    };
    for i in 1..=5u32 {
        let r = rls.ask("messaging", both()).await;
        assert_eq!(codes(&r), vec![(OK, 5 - i), (OK, 100 - i)]);
        assert_eq!(r.overall_code, OK);
        assert_eq!(limit_of(&r.statuses[0]), Some((5, DAY)));
    }
    let r = rls.ask("messaging", both()).await;
    assert_eq!(
        codes(&r),
        vec![(OVER, 0), (OK, 94)],
        "the OR of the decisions"
    );
    assert_eq!(r.overall_code, OVER);
    // Another number has counters of its own.
    let r = rls
        .ask(
            "messaging",
            vec![d(&[
                ("message_type", "marketing"),
                ("to_number", "2062222222"),
            ])],
        )
        .await;
    assert_eq!(codes(&r), vec![(OK, 4)]);
    rls.stop().await;
}

#[tokio::test]
async fn readme_example_3_most_specific_match_and_zero_limit() {
    let cfg = "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n";
    let mut rls = Rls::start(&[("ip.yaml", cfg)], &[]).await;
    let r = rls
        .ask(
            "edge_proxy_per_ip",
            vec![d(&[("remote_address", "50.0.0.1")])],
        )
        .await;
    assert_eq!(codes(&r), vec![(OK, 9)]);
    let r = rls
        .ask(
            "edge_proxy_per_ip",
            vec![d(&[("remote_address", "50.0.0.5")])],
        )
        .await;
    assert_eq!(codes(&r), vec![(OVER, 0)]);
    assert_eq!(limit_of(&r.statuses[0]), Some((0, SECOND)));
    rls.stop().await;
}

#[tokio::test]
async fn readme_example_4_limits_only_at_the_same_depth() {
    let flat = "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {requests_per_unit: 300, unit: second}\n";
    let mut rls = Rls::start(&[("e.yaml", flat)], &[]).await;
    let two = || vec![d(&[("key", "value"), ("subkey", "subvalue")])];
    let r = rls.ask("example4", two()).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    assert!(r.statuses[0].current_limit.is_none() && r.statuses[0].duration_until_reset.is_none());
    let nested = "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: {requests_per_unit: 300, unit: second}\n";
    rls.rewrite("e.yaml", nested).await.unwrap();
    assert_eq!(codes(&rls.ask("example4", two()).await), vec![(OK, 299)]);
    // A shorter request stops at a placeholder: no limit.
    assert_eq!(
        codes(&rls.ask("example4", vec![d(&[("key", "value")])]).await),
        vec![(OK, 0)]
    );
    rls.stop().await;
}

#[tokio::test]
async fn readme_example_5_unlimited() {
    let cfg = "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n  - key: azure\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    let mut rls = Rls::start(&[("i.yaml", cfg)], &[]).await;
    let r = rls
        .ask("internal", vec![d(&[("ldap", "x")]), d(&[("azure", "y")])])
        .await;
    assert_eq!(codes(&r), vec![(OK, u32::MAX), (OK, 99)]);
    assert!(r.statuses[0].current_limit.is_none() && r.statuses[0].duration_until_reset.is_none());
    rls.stop().await;
}

#[tokio::test]
async fn readme_example_6_shadow_mode_counts_but_never_refuses() {
    let cfg = "domain: example6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        rate_limit: {requests_per_unit: 10, unit: second}\n        shadow_mode: true\n      - key: user\n        value: user-b\n        rate_limit: {requests_per_unit: 20, unit: second}\n";
    let mut rls = Rls::start(&[("e.yaml", cfg)], &[]).await;
    let a = || vec![d(&[("service", "auth-service"), ("user", "user-a")])];
    for _ in 0..10 {
        rls.ask("example6", a()).await;
    }
    let r = rls.ask("example6", a()).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    assert_eq!(limit_of(&r.statuses[0]), Some((10, SECOND)));
    assert_eq!(reset_of(&r.statuses[0]), Some(1));
    let b = vec![dh(&[("service", "auth-service"), ("user", "user-b")], 21)];
    assert_eq!(rls.ask("example6", b).await.overall_code, OVER);
    let stats = rls.running().limiter.metrics();
    assert_eq!(
        stats.value(
            "example6.service.user_user-a",
            throttle_rls::metrics::Stat::ShadowMode
        ),
        1
    );
    rls.stop().await;
}

#[tokio::test]
async fn readme_example_7_replaces_leaves_the_replaced_counter_alone() {
    let cfg = "domain: example7\ndescriptors:\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          name: specific_limit\n          requests_per_unit: 5\n          unit: second\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces:\n            - name: specific_limit\n          requests_per_unit: 10\n          unit: second\n";
    let mut rls = Rls::start(&[("e.yaml", cfg)], &[]).await;
    let one = || d(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = || d(&[("key_2", "value_2"), ("user", "bkthomps")]);
    let r = rls.ask("example7", vec![one(), two()]).await;
    assert_eq!(codes(&r), vec![(OK, 0), (OK, 9)]);
    assert!(r.statuses[0].current_limit.is_none(), "replaced: no limit");
    // The replaced counter was not incremented.
    let r = rls.ask("example7", vec![one()]).await;
    assert_eq!(codes(&r), vec![(OK, 4)]);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "specific_limit"
    );
    rls.stop().await;
}

#[tokio::test]
async fn readme_examples_9_and_11_wildcards_and_share_threshold() {
    let cfg = "domain: example11\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: files_no_share\n    value: files_no_share/*\n    share_threshold: false\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: path\n    value: /api/*/action\n    rate_limit: {unit: minute, requests_per_unit: 20}\n";
    let mut rls = Rls::start(&[("e.yaml", cfg)], &[]).await;
    assert_eq!(
        codes(&rls.ask("example11", vec![d(&[("files", "files/a")])]).await),
        vec![(OK, 9)]
    );
    assert_eq!(
        codes(&rls.ask("example11", vec![d(&[("files", "files/b")])]).await),
        vec![(OK, 8)],
        "shared"
    );
    assert_eq!(
        codes(
            &rls.ask(
                "example11",
                vec![d(&[("files_no_share", "files_no_share/a")])]
            )
            .await
        ),
        vec![(OK, 9)]
    );
    assert_eq!(
        codes(
            &rls.ask(
                "example11",
                vec![d(&[("files_no_share", "files_no_share/b")])]
            )
            .await
        ),
        vec![(OK, 9)],
        "own counter"
    );
    assert_eq!(
        codes(
            &rls.ask("example11", vec![d(&[("path", "/api/123/action")])])
                .await
        ),
        vec![(OK, 19)]
    );
    assert_eq!(
        codes(
            &rls.ask("example11", vec![d(&[("path", "/api/123/other")])])
                .await
        ),
        vec![(OK, 0)]
    );
    rls.stop().await;
}

const FIVE: &str =
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

#[tokio::test]
async fn rejected_hits_are_still_counted() {
    let mut rls = Rls::start(&[("d.yaml", FIVE)], &[]).await;
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 3)]).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 1)]).await),
        vec![(OVER, 0)],
        "6 + 1 > 5"
    );
    rls.advance(60);
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OK, 4)],
        "a new window"
    );
    rls.stop().await;
}

#[tokio::test]
async fn windows_are_aligned_to_the_unix_epoch() {
    let cfg = "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: mo\n    rate_limit: {unit: month, requests_per_unit: 5}\n  - key: w\n    rate_limit: {unit: week, requests_per_unit: 5}\n";
    let mut rls = Rls::start(&[("d.yaml", cfg)], &[]).await;
    rls.advance(17);
    let now = T0 + 17;
    let r = rls
        .ask(
            "d",
            vec![d(&[("m", "x")]), d(&[("mo", "x")]), d(&[("w", "x")])],
        )
        .await;
    let resets: Vec<_> = r.statuses.iter().map(reset_of).collect();
    let month = 30 * 86_400;
    let week = 7 * 86_400;
    assert_eq!(
        resets,
        vec![
            Some(43),
            Some((month - now % month) as i64),
            Some((week - now % week) as i64)
        ]
    );
    // One second before the minute ends the count holds; at the boundary it is gone.
    rls.advance(42);
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("m", "x")])]).await),
        vec![(OK, 3)]
    );
    rls.advance(1);
    let r = rls.ask("d", vec![d(&[("m", "x")])]).await;
    assert_eq!(
        (codes(&r), reset_of(&r.statuses[0])),
        (vec![(OK, 4)], Some(60))
    );
    rls.stop().await;
}

#[tokio::test]
async fn hits_addend_request_zero_is_one_descriptor_zero_checks_only() {
    let mut rls = Rls::start(&[("d.yaml", FIVE)], &[]).await;
    let mut req = request("d", vec![d(&[("k", "v")])]);
    req.hits_addend = 0;
    assert_eq!(
        codes(&rls.try_ask(req.clone()).await.unwrap()),
        vec![(OK, 4)],
        "0 counts as 1"
    );
    req.hits_addend = 4;
    assert_eq!(codes(&rls.try_ask(req).await.unwrap()), vec![(OK, 0)]);
    for _ in 0..2 {
        assert_eq!(
            codes(&rls.ask("d", vec![dh(&[("k", "v")], 0)]).await),
            vec![(OK, 0)],
            "a check only"
        );
    }
    assert_eq!(
        codes(&rls.ask("d", vec![d(&[("k", "v")])]).await),
        vec![(OVER, 0)]
    );
    assert_eq!(
        codes(&rls.ask("d", vec![dh(&[("k", "v")], 0)]).await),
        vec![(OVER, 0)],
        "6 > 5 even unchanged"
    );
    rls.stop().await;
}

#[tokio::test]
async fn one_counter_per_value_and_shared_by_repeats_in_a_request() {
    let mut rls = Rls::start(&[("d.yaml", FIVE)], &[]).await;
    let r = rls
        .ask(
            "d",
            vec![d(&[("k", "a")]), d(&[("k", "a")]), d(&[("k", "b")])],
        )
        .await;
    assert_eq!(codes(&r), vec![(OK, 4), (OK, 3), (OK, 4)]);
    rls.stop().await;
}

#[tokio::test]
async fn request_overrides_and_unknown_domains() {
    let mut rls = Rls::start(&[("d.yaml", FIVE)], &[]).await;
    let r = rls
        .ask("d", vec![dl(&[("not", "configured")], 2, HOUR)])
        .await;
    assert_eq!(codes(&r), vec![(OK, 1)]);
    assert_eq!(limit_of(&r.statuses[0]), Some((2, HOUR)));
    assert_eq!(reset_of(&r.statuses[0]), Some(3600));
    rls.ask("d", vec![dl(&[("not", "configured")], 2, HOUR)])
        .await;
    assert_eq!(
        rls.ask("d", vec![dl(&[("not", "configured")], 2, HOUR)])
            .await
            .overall_code,
        OVER
    );
    // An unknown domain: everything OK, the override ignored.
    let r = rls
        .ask(
            "elsewhere",
            vec![dl(&[("k", "v")], 0, SECOND), d(&[("k", "v")])],
        )
        .await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0), (OK, 0)]));
    rls.stop().await;
}

#[tokio::test]
async fn global_shadow_mode_turns_only_the_overall_code() {
    let mut rls = Rls::start(&[("d.yaml", FIVE)], &[("SHADOW_MODE", "true")]).await;
    let r = rls.ask("d", vec![dh(&[("k", "v")], 6)]).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0)]));
    rls.stop().await;
}

#[tokio::test]
async fn quota_mode_is_over_only_when_every_quota_descriptor_is() {
    let cfg = "domain: q\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let mut rls = Rls::start(&[("q.yaml", cfg)], &[]).await;
    let r = rls
        .ask("q", vec![dh(&[("a", "x")], 2), d(&[("b", "x")])])
        .await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0), (OK, 4)]));
    let r = rls
        .ask("q", vec![d(&[("a", "x")]), dh(&[("b", "x")], 9)])
        .await;
    assert_eq!(r.overall_code, OVER);
    rls.stop().await;
}

/// Upstream's `isQuotaMode` is true for every descriptor but the unlimited
/// ones under global `QUOTA_MODE`: one with no limit (unmatched, replaced)
/// is a quota descriptor that passed, so one over beside it is not enough.
#[tokio::test]
async fn global_quota_mode_counts_a_descriptor_without_a_limit_as_passed() {
    let unlimited = "  - key: free\n    rate_limit: {unlimited: true}\n";
    let cfg = format!("{FIVE}{unlimited}");
    let mut rls = Rls::start(&[("d.yaml", cfg.as_str())], &[("QUOTA_MODE", "true")]).await;
    let r = rls
        .ask("d", vec![dh(&[("k", "v")], 6), d(&[("none", "x")])])
        .await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0), (OK, 0)]));
    // An unlimited descriptor is not a quota descriptor: the over one is
    // then every quota descriptor.
    let r = rls
        .ask("d", vec![dh(&[("k", "v")], 6), d(&[("free", "x")])])
        .await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OVER, 0), (OK, u32::MAX)])
    );
    let r = rls.ask("d", vec![d(&[("k", "v")])]).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![(OVER, 0)]));
    rls.stop().await;
}

#[tokio::test]
async fn response_headers_when_enabled() {
    let mut rls = Rls::start(
        &[("d.yaml", FIVE)],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    )
    .await;
    rls.advance(20);
    let r = rls.ask("d", vec![dh(&[("k", "v")], 2)]).await;
    let headers: Vec<_> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(
        headers,
        vec![
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "3"),
            ("RateLimit-Reset", "40")
        ]
    );
    rls.stop().await;
}
