//! `/json`, `/healthcheck`, `/rlconfig` and Prometheus over real sockets.

use crate::support::*;

const CFG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2, name: two}\n";

#[tokio::test]
async fn json_endpoint_speaks_protojson_with_upstream_status_codes() {
    let rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let addr = rls.running().http_addr;
    rls.advance(7);
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, ctype, text) = http(addr, "POST", "/json", body).await;
    assert_eq!((status, ctype.as_str()), (200, "application/json"));
    assert_eq!(
        text,
        r#"{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"name":"two","requestsPerUnit":2,"unit":"MINUTE"},"limitRemaining":1,"durationUntilReset":"53s"}]}"#
    );
    http(addr, "POST", "/json", body).await;
    let (status, _, text) = http(addr, "POST", "/json", body).await;
    assert_eq!(status, 429);
    assert!(
        text.starts_with(r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT""#),
        "{text}"
    );
    assert!(
        !text.contains("limitRemaining"),
        "zero values are left out: {text}"
    );
    // hitsAddend as protojson writes a uint32: a number or a decimal
    // string, 0 (counted as 1) to 4294967295; beyond, refused.
    let hits = |h: &str, i: usize| {
        format!(
            r#"{{"domain":"d","hitsAddend":{h},"descriptors":[{{"entries":[{{"key":"k","value":"h{i}"}}]}}]}}"#
        )
    };
    let counted = [
        ("0", 200),
        ("null", 200),
        ("1", 200),
        ("\"2\"", 200),
        ("1e0", 200),
        ("4294967295", 429),
    ];
    for (i, (h, status)) in counted.into_iter().enumerate() {
        let (got, _, text) = http(addr, "POST", "/json", &hits(h, i)).await;
        assert_eq!(got, status, "hitsAddend {h}: {text}");
    }
    for h in ["4294967296", "-1", "1.5", "\"x\"", "4.294967296e9"] {
        let (got, _, text) = http(addr, "POST", "/json", &hits(h, 9)).await;
        assert_eq!(
            (got, text.as_str()),
            (400, "Bad Request\n"),
            "hitsAddend {h}"
        );
    }
    for bad in [
        "{",
        r#"{"domain":"d","nope":1}"#,
        r#"{"domain":"","descriptors":[{"entries":[]}]}"#,
    ] {
        let (status, ctype, text) = http(addr, "POST", "/json", bad).await;
        assert_eq!((status, text.as_str()), (400, "Bad Request\n"), "{bad}");
        assert!(ctype.starts_with("text/plain"));
    }
    rls.stop().await;
}

#[tokio::test]
async fn healthcheck_and_rlconfig() {
    let rls = Rls::start(&[("d.yaml", CFG)], &[]).await;
    let (status, _, text) = http(rls.running().http_addr, "GET", "/healthcheck", "").await;
    assert_eq!((status, text.as_str()), (200, "OK"));
    let (status, _, text) = http(rls.running().debug_addr, "GET", "/rlconfig", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        text,
        "d.k: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
    );
    // The test clock exists only with RLS_TEST_CLOCK=true.
    let (status, _, _) = http(
        rls.running().debug_addr,
        "POST",
        "/test/clock?now_unix=5",
        "",
    )
    .await;
    assert_eq!(status, 404);
    rls.stop().await;
}

#[tokio::test]
async fn prometheus_metrics_with_upstream_names() {
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
    ];
    let mut rls = Rls::start(&[("d.yaml", CFG)], &env).await;
    for _ in 0..3 {
        rls.ask("d", vec![d(&[("k", "v")])]).await;
    }
    let (status, _, text) = http(rls.running().metrics_addr.unwrap(), "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for line in [
        r#"ratelimit_service_rate_limit_total_hits{domain="d",key1="k"} 3"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="d",key1="k"} 2"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="d",key1="k"} 1"#,
        r#"ratelimit_service_rate_limit_near_limit{domain="d",key1="k"} 1"#,
        "ratelimit_service_config_load_success 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
    }
    rls.stop().await;
}
