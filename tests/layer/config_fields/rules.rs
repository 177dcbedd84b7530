//! `count_if`, `skip`, a cost from a header at its edges, and a metered rule, each as in code.

use super::{ask, code, frozen, same_answers, Ask, UserId, MINUTE, RULE};
use http::StatusCode;
use tower_throttle::key::FromExtension;
use tower_throttle::meter::ActualCost;
use tower_throttle::{Policy, ThrottleLayer};

#[tokio::test]
async fn count_if_by_status_class_and_grpc_code_matches_code() {
    let file = format!("key: {{ extractor: user_id }}\ncount_if: {{ http: [401, 5xx] }}\n{RULE}");
    let layer = code(FromExtension::<UserId>::new())
        .count_if(|s| s == StatusCode::UNAUTHORIZED || s.is_server_error());
    let asks: Vec<Ask> = [200, 200, 401, 503, 200, 401, 404]
        .iter()
        .map(|s| ask("/login").header("x-status", s.to_string()))
        .collect();
    same_answers(&file, layer, &asks).await;
}

#[tokio::test]
async fn skip_by_path_and_method_matches_code() {
    let file = format!("key: {{ extractor: user_id }}\nskip: {{ paths: [/healthz, /metrics/*], methods: [OPTIONS] }}\n{RULE}");
    let layer = code(FromExtension::<UserId>::new()).skip_if(|req| {
        let p = req.uri().path();
        req.method() == http::Method::OPTIONS || p == "/healthz" || p.starts_with("/metrics/")
    });
    let mut asks = Vec::new();
    for path in [
        "/healthz",
        "/metrics/cpu",
        "/healthz/x",
        "/reply",
        "/metrics",
    ] {
        asks.extend([ask(path), ask(path), ask(path)]);
    }
    let mut options = ask("/reply");
    options.method = "OPTIONS";
    asks.extend([options.clone(), options]);
    same_answers(&file, layer, &asks).await;
}

/// A cost read from a header, at its edges: absent, 0, 1, the limit, above
/// it, `u64::MAX`, above it, negative, not a number, not UTF-8 — each the
/// same as in code (absent or unreadable: the default).
#[tokio::test]
async fn cost_from_a_header_matches_code_at_its_edges() {
    let file = "key: { extractor: user_id }\nrules: [{ name: reply, policy: { fixed_window: { limit: 100, window: 60s } }, cost: { header: x-cost, default: 3 } }]\n";
    let layer = ThrottleLayer::new(frozen(), Policy::fixed_window(100, MINUTE).unwrap())
        .name("reply")
        .key(FromExtension::<UserId>::new())
        .cost_fn(|req| {
            let v = req.headers().get("x-cost").and_then(|v| v.to_str().ok());
            v.and_then(|v| v.trim().parse().ok()).unwrap_or(3)
        })
        .headers_on_allowed(true);
    let file = format!("headers_on_allowed: true\n{file}");
    let values: [&[u8]; 10] = [
        b"0",
        b"1",
        b"100",
        b"101",
        b"18446744073709551615",
        b"18446744073709551616",
        b"-1",
        b"abc",
        b"\xff\xfe",
        b" 7 ",
    ];
    let mut asks = vec![ask("/a")];
    asks.extend(values.iter().map(|v| ask("/a").header("x-cost", v)));
    same_answers(&file, layer, &asks).await;
}

/// The metered rule of `examples/llm_tokens.rs`, from a file: the estimate
/// from `?max_tokens=`, settled with what the handler reports.
#[tokio::test]
async fn a_metered_rule_from_a_file_matches_code() {
    let file = "key: { extractor: user_id }\nheaders_on_allowed: true\nrules:\n  - name: tokens\n    policy: { fixed_window: { limit: 1000, window: 60s } }\n    cost: { query: max_tokens, default: 256 }\n    settle: reported\n    quota_unit: content-bytes\n";
    let layer = ThrottleLayer::new(frozen(), Policy::fixed_window(1000, MINUTE).unwrap())
        .name("tokens")
        .key(FromExtension::<UserId>::new())
        .cost_fn(|req| {
            let q = req.uri().query().unwrap_or("");
            q.split('&')
                .find_map(|p| p.strip_prefix("max_tokens=")?.parse().ok())
                .unwrap_or(256)
        })
        .settle_cost(ActualCost::Reported)
        .quota_unit(tower_throttle::response::QuotaUnit::ContentBytes)
        .headers_on_allowed(true);
    let asks = [
        ask("/v1?max_tokens=600").header("x-used", "100"),
        ask("/v1?max_tokens=0").header("x-used", "0"),
        ask("/v1").header("x-used", "50"),
        ask("/v1?max_tokens=900").header("x-used", "900"),
        ask("/v1?max_tokens=0").header("x-used", "7"),
        ask("/v1?max_tokens=1").header("x-used", "1"),
    ];
    same_answers(file, layer, &asks).await;
}
