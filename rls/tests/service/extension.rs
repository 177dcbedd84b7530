//! The extension: other algorithms, all-or-nothing counting, strict mode.

use crate::support::*;

#[tokio::test]
async fn gcra_with_burst() {
    let cfg = "domain: g\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra, burst: 2}\n";
    let mut rls = Rls::start(&[("g.yaml", cfg)], &[]).await;
    assert_eq!(
        codes(&rls.ask("g", vec![d(&[("user", "alice")])]).await),
        vec![(OK, 2)]
    );
    assert_eq!(
        codes(&rls.ask("g", vec![d(&[("user", "alice")])]).await),
        vec![(OK, 1)]
    );
    let r = rls.ask("g", vec![d(&[("user", "alice")])]).await;
    assert_eq!(codes(&r), vec![(OK, 0)]);
    assert_eq!(limit_of(&r.statuses[0]), Some((60, MINUTE)));
    assert_eq!(reset_of(&r.statuses[0]), Some(3), "until the burst is back");
    assert_eq!(
        codes(&rls.ask("g", vec![d(&[("user", "alice")])]).await),
        vec![(OVER, 0)]
    );
    rls.advance(1);
    assert_eq!(
        codes(&rls.ask("g", vec![d(&[("user", "alice")])]).await),
        vec![(OK, 0)],
        "one more a second"
    );
    rls.stop().await;
}

#[tokio::test]
async fn sliding_log_and_sliding_window() {
    let cfg = "domain: s\ndescriptors:\n  - key: log\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_log}\n  - key: win\n    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}\n";
    let mut rls = Rls::start(&[("s.yaml", cfg)], &[]).await;
    let log = || vec![d(&[("log", "x")])];
    rls.advance(50);
    assert_eq!(codes(&rls.ask("s", log()).await), vec![(OK, 1)]);
    assert_eq!(codes(&rls.ask("s", log()).await), vec![(OK, 0)]);
    assert_eq!(codes(&rls.ask("s", log()).await), vec![(OVER, 0)]);
    // Past the minute boundary a fixed window would reset; the log does not.
    rls.advance(30);
    assert_eq!(codes(&rls.ask("s", log()).await), vec![(OVER, 0)]);
    rls.advance(31);
    assert_eq!(codes(&rls.ask("s", log()).await), vec![(OK, 1)]);
    let win = || vec![d(&[("win", "x")])];
    assert_eq!(codes(&rls.ask("s", win()).await), vec![(OK, 1)]);
    assert_eq!(codes(&rls.ask("s", win()).await), vec![(OK, 0)]);
    assert_eq!(codes(&rls.ask("s", win()).await), vec![(OVER, 0)]);
    rls.stop().await;
}

const TWO_RULES: &str = "domain: a\ndescriptors:\n  - key: tight\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: loose\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: never\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";

#[tokio::test]
async fn by_default_every_descriptor_is_charged() {
    let mut rls = Rls::start(&[("a.yaml", TWO_RULES)], &[]).await;
    let both = || vec![d(&[("tight", "x")]), d(&[("loose", "x")])];
    assert_eq!(codes(&rls.ask("a", both()).await), vec![(OK, 0), (OK, 4)]);
    assert_eq!(codes(&rls.ask("a", both()).await), vec![(OVER, 0), (OK, 3)]);
    assert_eq!(
        codes(&rls.ask("a", vec![d(&[("loose", "x")])]).await),
        vec![(OK, 2)]
    );
    rls.stop().await;
}

#[tokio::test]
async fn all_or_nothing_charges_nothing_for_a_refused_request() {
    for env in [
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ("RLS_ALL_OR_NOTHING", "true"),
    ] {
        let mut rls = Rls::start(&[("a.yaml", TWO_RULES)], &[env]).await;
        let both = || vec![d(&[("tight", "x")]), d(&[("loose", "x")])];
        assert_eq!(codes(&rls.ask("a", both()).await), vec![(OK, 0), (OK, 4)]);
        let r = rls.ask("a", both()).await;
        assert_eq!(
            (r.overall_code, codes(&r)),
            (OVER, vec![(OVER, 0), (OK, 4)]),
            "{env:?}"
        );
        assert_eq!(
            codes(&rls.ask("a", vec![d(&[("loose", "x")])]).await),
            vec![(OK, 3)],
            "not charged before"
        );
        // requests_per_unit: 0 refuses the whole request, charging nothing.
        let r = rls
            .ask("a", vec![d(&[("never", "x")]), d(&[("loose", "x")])])
            .await;
        assert_eq!(codes(&r), vec![(OVER, 0), (OK, 3)]);
        // Its refused hit was not counted either: a check sees only the
        // one admitted hit.
        assert_eq!(
            codes(&rls.ask("a", vec![dh(&[("tight", "x")], 0)]).await),
            vec![(OK, 0)]
        );
        rls.stop().await;
    }
}

#[tokio::test]
async fn strict_mode_refuses_extension_keys_at_load() {
    let cfg = "domain: g\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: gcra}\n";
    let mut rls = Rls::start(&[("g.yaml", cfg)], &[("RLS_STRICT_UPSTREAM_KEYS", "true")]).await;
    let err = rls
        .try_ask(request("g", vec![d(&[("user", "a")])]))
        .await
        .unwrap_err();
    assert_eq!(err.message(), "no rate limit configuration loaded");
    let dump = rls.running().limiter.dump();
    assert!(
        dump.contains("config error, unknown key 'algorithm'") && dump.contains("g.yaml:4:"),
        "{dump}"
    );
    rls.stop().await;
}

#[tokio::test]
async fn all_or_nothing_never_lets_a_shadow_rule_freeze_the_others() {
    let cfg = "domain: s\ndescriptors:\n  - key: trial\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: real\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let mut rls = Rls::start(&[("s.yaml", cfg)], &[("RLS_ALL_OR_NOTHING", "true")]).await;
    let both = || vec![d(&[("trial", "x")]), d(&[("real", "x")])];
    assert_eq!(codes(&rls.ask("s", both()).await), vec![(OK, 0), (OK, 4)]);
    let r = rls.ask("s", both()).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OK, vec![(OK, 0), (OK, 3)]),
        "admitted, so charged"
    );
    rls.stop().await;
}

#[tokio::test]
async fn all_or_nothing_takes_one_descriptor_with_two_overrides() {
    let mut rls = Rls::start(&[("a.yaml", TWO_RULES)], &[("RLS_ALL_OR_NOTHING", "true")]).await;
    // One counter, two limits: no store error, upstream's answer (1 <= 3; 2 > 1).
    let r = rls
        .ask(
            "a",
            vec![dl(&[("x", "y")], 3, MINUTE), dl(&[("x", "y")], 1, MINUTE)],
        )
        .await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OK, 2), (OVER, 0)])
    );
    assert!(rls.running().health.is_healthy());
    rls.stop().await;
}
