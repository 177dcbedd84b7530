//! What a file says beyond rules and keys (feature `config`), each option
//! checked against the same layer built in code: same requests, same
//! statuses and fields. And every value a file or a client controls at
//! its edges.

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{Extractors, LayerConfig, RuleTable};
use tower_throttle::key::{FromExtension, HeaderKey};
use tower_throttle::meter::{ActualCost, ReportedCost};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::response::{FieldProfile, ResetFormat};
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

const MINUTE: Duration = Duration::from_secs(60);

fn frozen() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

/// The user id an authentication layer puts in the extensions.
#[derive(Clone)]
struct UserId(u32);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "u{}", self.0)
    }
}

/// The plan an authentication layer puts in the extensions.
#[derive(Clone)]
struct Plan(&'static str);

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

fn extractors() -> Extractors {
    Extractors::new()
        .with("user_id", FromExtension::<UserId>::new())
        .with("plan", FromExtension::<Plan>::new())
}

/// Answers with `x-status` as its status and `x-used` as a `ReportedCost`.
fn inner(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|req: Request<()>| async move {
        let header = |name: &str| req.headers().get(name)?.to_str().ok()?.parse::<u64>().ok();
        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
        if let Some(status) = header("x-status") {
            *response.status_mut() = StatusCode::from_u16(status as u16).unwrap();
        }
        if let Some(used) = header("x-used") {
            response.extensions_mut().insert(ReportedCost(used));
        }
        Ok(response)
    })
}

/// One request: method, path, headers, and the extensions auth would set.
#[derive(Clone)]
struct Ask {
    method: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, Vec<u8>)>,
    user: Option<u32>,
    plan: Option<&'static str>,
}

fn ask(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: Vec::new(),
        user: Some(1),
        plan: None,
    }
}

impl Ask {
    fn header(mut self, name: &'static str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((name, value.as_ref().to_vec()));
        self
    }
    fn request(&self) -> Request<()> {
        let mut b = Request::builder().method(self.method).uri(self.path);
        for (name, value) in &self.headers {
            b = b.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let mut req = b.body(()).unwrap();
        if let Some(u) = self.user {
            req.extensions_mut().insert(UserId(u));
        }
        if let Some(p) = self.plan {
            req.extensions_mut().insert(Plan(p));
        }
        req
    }
}

/// What a client sees of an answer: status, the rate-limit fields, body.
async fn answer<S>(svc: &mut S, ask: &Ask) -> (StatusCode, Vec<(String, String)>, Bytes)
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>>,
    S::Error: fmt::Debug,
{
    let response = svc
        .ready()
        .await
        .unwrap()
        .call(ask.request())
        .await
        .unwrap();
    let status = response.status();
    let fields = rate_fields(response.headers());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, fields, body)
}

fn rate_fields(headers: &HeaderMap) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = headers
        .iter()
        .filter(|(n, _)| {
            n.as_str().contains("ratelimit") || *n == "retry-after" || *n == "content-type"
        })
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    fields.sort();
    fields
}

/// Sends `asks` through a layer built from `file` and through `code`'s,
/// each on a store of its own on a frozen clock: every answer the same.
async fn same_answers(file: &str, code: ThrottleLayer<MemoryStore<ManualClock>>, asks: &[Ask]) {
    let config = LayerConfig::parse("limits.yaml", file).unwrap();
    let from_file = config.layer_with(frozen(), &extractors()).unwrap();
    let mut a = from_file.layer(inner());
    let mut b = code.layer(inner());
    for (i, ask) in asks.iter().enumerate() {
        let (x, y) = (answer(&mut a, ask).await, answer(&mut b, ask).await);
        assert_eq!(x, y, "request {i} ({} {}) of\n{file}", ask.method, ask.path);
    }
}

const RULE: &str =
    "rules: [{ name: reply, policy: { fixed_window: { limit: 2, window: 60s } } }]\n";

fn reply() -> Policy {
    Policy::fixed_window(2, MINUTE).unwrap()
}

fn code(key: impl tower_throttle::key::KeyExtractor) -> ThrottleLayer<MemoryStore<ManualClock>> {
    ThrottleLayer::new(frozen(), reply()).name("reply").key(key)
}

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

/// Tiers by a registered extractor (the plan auth set), and the user id
/// from an extension: a client's header changes nothing.
#[tokio::test]
async fn tiers_and_extension_keys_match_code() {
    let file = "key: { extractor: user_id }\nrules:\n  - name: reply\n    policy: { fixed_window: { limit: 2, window: 60s } }\n    tiers:\n      by: { extractor: plan }\n      policies:\n        pro: { fixed_window: { limit: 4, window: 60s } }\n";
    let pro = Policy::fixed_window(4, MINUTE).unwrap();
    let layer = ThrottleLayer::new(frozen(), reply())
        .name("reply")
        .key(FromExtension::<UserId>::new())
        .policy_fn(move |req| {
            let plan = req.extensions().get::<Plan>()?;
            (plan.0 == "pro").then_some(pro)
        });
    let mut asks = Vec::new();
    for (user, plan) in [(1, None), (2, Some("pro")), (3, Some("free"))] {
        for _ in 0..5 {
            let mut a = ask("/reply")
                .header("x-plan", "pro")
                .header("x-user-id", "9");
            a.user = Some(user);
            a.plan = plan;
            asks.push(a);
        }
    }
    same_answers(file, layer, &asks).await;
}

/// A request without the extension key: `on_missing_key` as in code.
#[tokio::test]
async fn on_missing_key_matches_code() {
    for (form, mode) in [
        ("skip", OnMissingKey::Skip),
        (
            "{ reject: 403 }",
            OnMissingKey::Reject(StatusCode::FORBIDDEN),
        ),
    ] {
        let file = format!("key: {{ extractor: user_id }}\non_missing_key: {form}\n{RULE}");
        let layer = code(FromExtension::<UserId>::new()).on_missing_key(mode);
        let mut anonymous = ask("/reply");
        anonymous.user = None;
        same_answers(
            &file,
            layer,
            &[anonymous.clone(), anonymous.clone(), anonymous],
        )
        .await;
    }
}

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

/// A header key from the file and from code agree on a value with bytes
/// that are not UTF-8 (what a client may send).
#[tokio::test]
async fn a_header_key_with_invalid_bytes_matches_code() {
    let file = format!("key: {{ header: x-user }}\n{RULE}");
    let layer = code(HeaderKey::new(http::HeaderName::from_static("x-user")));
    let asks: Vec<Ask> = (0..3)
        .map(|_| ask("/r").header("x-user", b"\xffann"))
        .collect();
    same_answers(&file, layer, &asks).await;
}
