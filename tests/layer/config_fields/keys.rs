//! Tiers, extension keys, `on_missing_key` and header keys with invalid bytes, each as in code.

use super::{ask, code, frozen, reply, same_answers, Ask, Plan, UserId, MINUTE, RULE};
use http::StatusCode;
use tower_throttle::key::{FromExtension, HeaderKey};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::{Policy, ThrottleLayer};

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
