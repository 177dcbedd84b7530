//! Tests of the layer's own responses and rate-limit headers.
use super::*;
use crate::info::{Meta, RuleDecision, RuleSummary};
use crate::response::fields::push_u64;
use crate::{Decision, Policy};
use std::time::Duration;

#[test]
fn decimal_digits_match_display() {
    for n in [0, 7, 10, 99, 1_000_000, SF_INT_MAX, u64::MAX] {
        let mut out = Vec::new();
        push_u64(&mut out, n);
        assert_eq!(out, n.to_string().into_bytes());
    }
}

fn settings(ietf: bool, legacy: bool) -> FieldSettings {
    FieldSettings {
        ietf_headers: ietf,
        legacy_headers: legacy,
        ..FieldSettings::default()
    }
}

fn meta(legacy: bool) -> Arc<Meta> {
    Arc::new(layer_meta(rules(), &settings(true, legacy)))
}

fn rules() -> Box<[RuleSummary]> {
    vec![
        RuleSummary {
            name: "reply".into(),
            policy: Policy::sliding_log(5, Duration::from_secs(60)).unwrap(),
            unit: None,
            exhausted: Default::default(),
        },
        RuleSummary {
            name: "upload".into(),
            policy: Policy::concurrency(2).unwrap(),
            unit: None,
            exhausted: Default::default(),
        },
        RuleSummary {
            name: "post".into(),
            policy: Policy::cell(15, 30, Duration::from_secs(3600)).unwrap(),
            unit: None,
            exhausted: Default::default(),
        },
    ]
    .into()
}

fn decision(allowed: bool, remaining: u64, retry_ms: Option<u64>, reset_ms: u64) -> Decision {
    Decision {
        charged: 0,
        charged_at_ns: 0,
        decided_by: Default::default(),
        allowed,
        limit: 5,
        remaining,
        retry_after: retry_ms.map(Duration::from_millis),
        reset_after: Duration::from_millis(reset_ms),
        quota_after: Duration::from_millis(retry_ms.unwrap_or(reset_ms.min(12_000))),
        permit: None,
    }
}

/// Two rules: `reply` denies (retry in 41.2 s), `post` admits with 3 left.
fn reply_denied_post_allowed(meta: Arc<Meta>) -> RateLimitInfo {
    RateLimitInfo::many(
        meta,
        vec![
            RuleDecision {
                rule: 0,
                policy: rules()[0].policy,
                decision: decision(false, 0, Some(41_200), 59_000),
                pk: None,
            },
            RuleDecision {
                rule: 2,
                policy: rules()[2].policy,
                decision: decision(true, 3, None, 8_001),
                pk: None,
            },
        ],
    )
}

#[test]
fn policy_header_syntax() {
    let m = meta(false);
    assert_eq!(
        m.policy_header.as_ref().unwrap(),
        "\"reply\";q=5;w=60, \"upload\";q=2;qu=\"concurrent-requests\", \"post\";q=16;w=1920"
    );
}

#[test]
fn denied_response_headers_and_body() {
    let info = reply_denied_post_allowed(meta(true));
    let r = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(&info));
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = r.headers();
    assert_eq!(h[RETRY_AFTER], "42");
    // `t` is when more quota comes (the retry), not the full reset (59 s),
    // which stays in the legacy field.
    assert_eq!(h[RATELIMIT], "\"reply\";r=0;t=42, \"post\";r=3;t=9");
    assert_eq!(h[X_RATELIMIT_LIMIT], "5");
    assert_eq!(h[X_RATELIMIT_REMAINING], "0");
    assert_eq!(h[X_RATELIMIT_RESET], "59");
    assert_eq!(h[CONTENT_TYPE], "text/plain; charset=utf-8");
    assert_eq!(r.body(), "Too many requests: try again in 42 s.\n");

    let r = rejection_response(&BodyFormat::ProblemJson, &Rejection::Limited(&info));
    assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    assert_eq!(
        r.body(),
        "{\"type\":\"https://iana.org/assignments/http-problem-types#quota-exceeded\",\
         \"title\":\"Quota Exceeded\",\"status\":429,\
         \"detail\":\"Too many requests: try again in 42 s.\",\"violated-policies\":[\"reply\"]}"
    );
}

#[test]
fn retry_after_is_never_zero_and_absent_when_never() {
    let info = RateLimitInfo::one(
        meta(false),
        RuleDecision {
            rule: 0,
            policy: rules()[0].policy,
            decision: decision(false, 0, Some(1), 1),
            pk: None,
        },
    );
    let r = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(&info));
    assert_eq!(r.headers()[RETRY_AFTER], "1");
    assert!(r.headers().get(X_RATELIMIT_LIMIT).is_none());
    let never = RateLimitInfo::one(
        meta(false),
        RuleDecision {
            rule: 0,
            policy: rules()[0].policy,
            decision: decision(false, 0, None, 0),
            pk: None,
        },
    );
    let r = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(&never));
    assert!(r.headers().get(RETRY_AFTER).is_none());
    assert!(r
        .body()
        .starts_with(b"Too many requests: this request exceeds"));
}

#[test]
fn custom_responses_keep_their_status_and_get_headers() {
    let info = RateLimitInfo::one(
        meta(false),
        RuleDecision {
            rule: 0,
            policy: rules()[0].policy,
            decision: decision(false, 0, Some(2_500), 3_000),
            pk: None,
        },
    );
    let custom = BodyFormat::Custom(Arc::new(|r: &Rejection<'_>| {
        let mut resp = Response::new(Bytes::from_static(b"slow down"));
        *resp.status_mut() = r.status();
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("9"));
        resp
    }));
    let r = rejection_response(&custom, &Rejection::Limited(&info));
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()[RETRY_AFTER], "9");
    assert_eq!(r.headers()[RATELIMIT], "\"reply\";r=0;t=3");
}

/// The default 429 comes from a prebuilt header map; it must equal the
/// response built field by field (what a custom plain-text body gets).
#[test]
fn prebuilt_429_matches_the_field_by_field_one() {
    let plain = BodyFormat::Custom(Arc::new(|r: &Rejection<'_>| {
        let mut resp = Response::new(plain_text(r));
        *resp.status_mut() = r.status();
        resp.headers_mut().insert(CONTENT_TYPE, TEXT_PLAIN);
        resp
    }));
    let sorted = |r: &Response<Bytes>| {
        let mut fields: Vec<(String, Vec<u8>)> = r
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        fields.sort();
        fields
    };
    for (ietf, legacy) in [(true, false), (true, true), (false, true), (false, false)] {
        let meta = Arc::new(layer_meta(rules(), &settings(ietf, legacy)));
        let one = |d| {
            RateLimitInfo::one(
                meta.clone(),
                RuleDecision {
                    rule: 0,
                    policy: rules()[0].policy,
                    decision: d,
                    pk: None,
                },
            )
        };
        let cases = [
            one(decision(false, 0, Some(1_500), 60_000)),
            one(decision(false, 2, Some(300_000), 900_000)),
            one(decision(false, 0, Some(1), 200_000)),
            reply_denied_post_allowed(meta.clone()),
        ];
        for info in &cases {
            let fast = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(info));
            let slow = rejection_response(&plain, &Rejection::Limited(info));
            assert_eq!(fast.status(), slow.status());
            assert_eq!(
                sorted(&fast),
                sorted(&slow),
                "ietf {ietf} legacy {legacy} {info:?}"
            );
            assert_eq!(fast.body(), slow.body());
        }
    }
}

#[test]
fn legacy_reset_as_a_unix_timestamp() {
    let mut m = layer_meta(rules(), &settings(false, true));
    m.legacy_reset = ResetFormat::UnixTimestamp;
    let info = reply_denied_post_allowed(Arc::new(m));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let r = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(&info));
    let reset: u64 = r.headers()[X_RATELIMIT_RESET]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // The full reset (59 s) from now, rounded up.
    assert!(
        (before + 59..=before + 61).contains(&reset),
        "{reset} vs {before}"
    );
    assert_eq!(r.headers()[RETRY_AFTER], "42");
}

#[test]
fn a_per_request_policy_renders_its_own_policy_field() {
    let premium = Policy::sliding_log(50, Duration::from_secs(60)).unwrap();
    let info = RateLimitInfo::one(
        meta(false),
        RuleDecision {
            rule: 0,
            policy: premium,
            decision: decision(false, 0, Some(1_500), 60_000),
            pk: None,
        },
    );
    let r = rejection_response(&BodyFormat::PlainText, &Rejection::Limited(&info));
    // Every rule of the layer, the applied policy where it was checked.
    assert_eq!(
        r.headers()[RATELIMIT_POLICY],
        "\"reply\";q=50;w=60, \"upload\";q=2;qu=\"concurrent-requests\", \"post\";q=16;w=1920"
    );
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &info);
    assert_eq!(headers[RATELIMIT_POLICY], r.headers()[RATELIMIT_POLICY]);
    assert_eq!(info.policy("reply"), Some(&premium));
}

/// The common 429 (one rule, nothing remaining, `t` equal to
/// `Retry-After`) comes from the complete fields cached by seconds; every
/// one of them is the response the template gives, field for field, and
/// every other denial is rendered from the template.
#[test]
fn the_cached_common_429_is_the_templates_429() {
    let as_parts = |r: Box<Response<Bytes>>| {
        let fields: Vec<(String, Vec<u8>)> = r
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        (r.status(), fields, r.body().clone())
    };
    for ietf in [true, false] {
        let meta = Arc::new(layer_meta(rules(), &settings(ietf, false)));
        let mut cached = 0;
        for rule in [0, 2] {
            // Retry in 0.2 s to 130 s (past the table), nothing remaining,
            // or 1 remaining (a cost the rest cannot cover), or `t` sooner
            // than `Retry-After`.
            for retry_ms in (200..130_000).step_by(900) {
                for (remaining, quota_ms) in [(0, retry_ms), (1, retry_ms), (0, retry_ms / 3)] {
                    let mut d = decision(false, remaining, Some(retry_ms), retry_ms + 5_000);
                    d.quota_after = Duration::from_millis(quota_ms);
                    let info = RateLimitInfo::one(
                        meta.clone(),
                        RuleDecision {
                            rule,
                            policy: rules()[rule].policy,
                            decision: d,
                            pk: None,
                        },
                    );
                    let common = common_limited(&meta, rule, &d);
                    let expect_cached = remaining == 0
                        && d.retry_after_secs() == Some(d.quota_after_secs())
                        && d.quota_after_secs() < crate::response::fields::CACHED;
                    assert_eq!(
                        common.is_some(),
                        expect_cached,
                        "{rule} {retry_ms} {remaining}"
                    );
                    cached += usize::from(common.is_some());
                    let template = as_parts(limited::from_template(&info).unwrap());
                    let given = limited::limited_plain_text(&info).unwrap();
                    assert_eq!(as_parts(given), template);
                    if let Some(common) = common {
                        assert_eq!(as_parts(common), template);
                    }
                }
            }
        }
        assert!(cached > 200, "the table was used: {cached}");
    }
    // Legacy fields carry the reset, which the table does not hold.
    let legacy = Arc::new(layer_meta(rules(), &settings(true, true)));
    assert!(common_limited(&legacy, 0, &decision(false, 0, Some(2_000), 9_000)).is_none());
}
