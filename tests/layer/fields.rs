//! The IETF fields and the problem body as a client reads them: every
//! response comes from an axum app through `oneshot`, every field is parsed
//! with the `sfv` crate (RFC 9651) and every body with `serde_json`, never
//! with the crate's own writer. For each profile: admitted and denied
//! responses, several rules, a lock-out, a byte quota, partition keys.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post;
use axum::Router;
use http::{HeaderMap, HeaderName, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;
use tower_throttle::key::HeaderKey;
use tower_throttle::lockout::Penalty;
use tower_throttle::response::{FieldProfile, PartitionKeys, QuotaUnit, QUOTA_EXCEEDED};
use tower_throttle::{MemoryStore, Policy, Rule, ThrottleLayer};

const MIN: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);
const PROFILES: [FieldProfile; 2] = [FieldProfile::Draft10, FieldProfile::Draft11];
const SECRET: &[u8] = b"sixteen or more secret bytes";

/// A parameter's value, as RFC 9651 types it.
#[derive(Debug, PartialEq, Eq, Clone)]
enum Param {
    Int(i64),
    Str(String),
    Bytes(Vec<u8>),
}

/// One list member: the policy name and its parameters.
#[derive(Debug, PartialEq, Eq, Clone)]
struct Member {
    name: String,
    params: BTreeMap<String, Param>,
}

impl Member {
    fn int(&self, key: &str) -> i64 {
        match self.params.get(key) {
            Some(Param::Int(n)) => *n,
            other => panic!("{key} of {self:?} is {other:?}, not an integer"),
        }
    }
}

/// Every line of field `name` joined as RFC 9651 section 4.2 says, then
/// parsed as a List of Items whose values are Strings (the draft's syntax).
fn list(headers: &HeaderMap, name: &str) -> Vec<Member> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(!lines.is_empty(), "no {name} field in {headers:?}");
    let joined = lines.join(", ");
    let parsed = sfv::Parser::new(&joined)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{name}: {joined:?} is not an RFC 9651 list: {e}"));
    parsed
        .into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{name}: an inner list in {joined:?}")
            };
            let name = item.bare_item.as_string().expect("a String").as_str();
            let params = item.params.iter().map(|(key, value)| {
                let value = if let Some(n) = value.as_integer() {
                    Param::Int(i64::from(n))
                } else if let Some(s) = value.as_string() {
                    Param::Str(s.as_str().to_owned())
                } else if let Some(b) = value.as_byte_sequence() {
                    Param::Bytes(b.to_vec())
                } else {
                    panic!("{key:?} of {joined:?} has an unexpected type")
                };
                (key.as_str().to_owned(), value)
            });
            Member {
                name: name.to_owned(),
                params: params.collect(),
            }
        })
        .collect()
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn problem(&self) -> Value {
        assert_eq!(self.headers["content-type"], "application/problem+json");
        serde_json::from_str(&self.body).unwrap()
    }
}

async fn send(app: &Router, user: &str, bytes: usize) -> Reply {
    let req = Request::post("/")
        .header("x-user", user)
        .header("content-length", bytes)
        .body(Body::from(vec![b'x'; bytes]))
        .unwrap();
    let r = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn app(layer: ThrottleLayer<MemoryStore>) -> Router {
    Router::new()
        .route("/", post(|| async { "ok" }))
        .route_layer(layer)
}

/// `minute`: 2 a minute, `day`: 100 a day, per `x-user`, every field on.
fn two_rules(profile: FieldProfile) -> ThrottleLayer<MemoryStore> {
    ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(2, MIN).unwrap())
        .name("minute")
        .and(Rule::new("day", Policy::fixed_window(100, DAY).unwrap()))
        .key(HeaderKey::new(HeaderName::from_static("x-user")))
        .prefix("secret-prefix")
        .headers_on_allowed(true)
        .problem_json_body()
        .partition_keys(PartitionKeys::with_secret(SECRET))
        .field_profile(profile)
}

fn pk_of(user: &str) -> Param {
    Param::Bytes(
        PartitionKeys::with_secret(SECRET)
            .of(user.as_bytes())
            .to_vec(),
    )
}

#[tokio::test]
async fn each_profile_writes_the_drafts_fields_on_admitted_and_denied_responses() {
    let mut seen = Vec::new();
    for profile in PROFILES {
        let app = app(two_rules(profile));
        let policy = |r: &Reply| list(&r.headers, "ratelimit-policy");
        let first = send(&app, "alice", 0).await;
        assert_eq!(first.status, StatusCode::OK);
        let policies = policy(&first);
        let names: Vec<&str> = policies.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["minute", "day"], "{profile:?}");
        assert_eq!((policies[0].int("q"), policies[0].int("w")), (2, 60));
        assert_eq!((policies[1].int("q"), policies[1].int("w")), (100, 86_400));
        // `requests` is the default unit: not written.
        assert!(policies.iter().all(|m| !m.params.contains_key("qu")));
        // `pk` is only on `RateLimit` items.
        assert!(policies.iter().all(|m| !m.params.contains_key("pk")));
        let limits = list(&first.headers, "ratelimit");
        assert_eq!(limits[0].name, "minute");
        assert_eq!((limits[0].int("r"), limits[1].int("r")), (1, 99));
        assert_eq!(limits[0].params["pk"], pk_of("alice"));
        assert_eq!(limits[1].params["pk"], pk_of("alice"), "one client, one pk");

        assert_eq!(send(&app, "alice", 0).await.status, StatusCode::OK);
        let denied = send(&app, "alice", 0).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(policy(&denied), policies, "the policy field stays the same");
        let limits = list(&denied.headers, "ratelimit");
        assert_eq!((limits[0].int("r"), limits[1].int("r")), (0, 98));
        let t = limits[0].int("t");
        assert!((1..=60).contains(&t), "{t}");
        let retry: i64 = denied.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            retry >= t,
            "Retry-After {retry} is never earlier than t {t}"
        );
        let problem = denied.problem();
        assert_eq!(problem["type"], QUOTA_EXCEEDED);
        assert_eq!(
            QUOTA_EXCEEDED,
            "https://iana.org/assignments/http-problem-types#quota-exceeded"
        );
        assert_eq!(problem["title"], "Quota Exceeded");
        assert_eq!(problem["status"], 429);
        // Only the rule that denied, not `day`, which would have admitted.
        assert_eq!(problem["violated-policies"], serde_json::json!(["minute"]));
        assert!(problem.get("retry_after").is_none());
        for leak in ["alice", "secret-prefix", "minute:"] {
            assert!(!denied.body.contains(leak), "{leak} in {}", denied.body);
            for value in denied.headers.values() {
                assert!(
                    !value.to_str().unwrap().contains(leak),
                    "{leak} in {value:?}"
                );
            }
        }

        let bob = list(&send(&app, "bob", 0).await.headers, "ratelimit");
        assert_ne!(bob[0].params["pk"], pk_of("alice"));
        seen.push((policies, limits.len()));
    }
    assert_eq!(seen[0], seen[1], "-10 and -11 define the same fields");
    assert_eq!(FieldProfile::default(), FieldProfile::Draft11);
    assert_eq!(
        FieldProfile::default().draft(),
        tower_throttle::response::DRAFT
    );
}

#[tokio::test]
async fn violated_policies_names_every_denying_rule_and_only_those() {
    for profile in PROFILES {
        let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(1, MIN).unwrap())
            .name("burst")
            .and(Rule::new(
                "hour",
                Policy::fixed_window(1, MIN * 60).unwrap(),
            ))
            .and(Rule::new("day", Policy::fixed_window(100, DAY).unwrap()))
            .key(HeaderKey::new(HeaderName::from_static("x-user")))
            .problem_json_body()
            .field_profile(profile);
        let app = app(layer);
        assert_eq!(send(&app, "carol", 0).await.status, StatusCode::OK);
        let denied = send(&app, "carol", 0).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        let problem = denied.problem();
        assert_eq!(
            problem["violated-policies"],
            serde_json::json!(["burst", "hour"])
        );
        let names: Vec<String> = list(&denied.headers, "ratelimit-policy")
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ["burst", "hour", "day"]);
        // No `pk` unless asked for.
        let limits = list(&denied.headers, "ratelimit");
        assert!(limits.iter().all(|m| !m.params.contains_key("pk")));
        assert_eq!(limits[2].int("r"), 99);
    }
}

#[tokio::test]
async fn a_lockout_denial_is_quota_exceeded_for_the_locked_rule() {
    for profile in PROFILES {
        let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(1, MIN).unwrap())
            .name("login")
            .key(HeaderKey::new(HeaderName::from_static("x-user")))
            .lockout(Penalty::new(2, 10 * MIN, 5 * MIN).unwrap())
            .problem_json_body()
            .partition_keys(PartitionKeys::with_secret(SECRET))
            .field_profile(profile);
        let app = app(layer);
        assert_eq!(send(&app, "dave", 0).await.status, StatusCode::OK);
        // Two strikes: the second locks the key for 5 minutes.
        for _ in 0..2 {
            assert_eq!(send(&app, "dave", 0).await.status, 429);
        }
        let locked = send(&app, "dave", 0).await;
        assert_eq!(locked.status, StatusCode::TOO_MANY_REQUESTS);
        let limits = list(&locked.headers, "ratelimit");
        assert_eq!(limits.len(), 1);
        assert_eq!((limits[0].name.as_str(), limits[0].int("r")), ("login", 0));
        let t = limits[0].int("t");
        assert!(
            (240..=300).contains(&t),
            "the lock's time left, not the rule's: {t}"
        );
        assert_eq!(limits[0].params["pk"], pk_of("dave"));
        let problem = locked.problem();
        assert_eq!(problem["type"], QUOTA_EXCEEDED);
        assert_eq!(problem["violated-policies"], serde_json::json!(["login"]));
    }
}

#[tokio::test]
async fn a_byte_quota_announces_content_bytes() {
    for profile in PROFILES {
        let bytes = |req: &tower_throttle::key::RequestHead<'_>| {
            let length = req.headers().get(http::header::CONTENT_LENGTH);
            length
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0)
        };
        let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(10, MIN).unwrap())
            .name("calls")
            .and(
                Rule::new("upload", Policy::sliding_window(1_000, MIN).unwrap())
                    .cost_fn(bytes)
                    .quota_unit(QuotaUnit::ContentBytes),
            )
            .and(Rule::new("inflight", Policy::concurrency(4).unwrap()))
            .key(HeaderKey::new(HeaderName::from_static("x-user")))
            .headers_on_allowed(true)
            .problem_json_body()
            .field_profile(profile);
        let app = app(layer);
        let first = send(&app, "erin", 600).await;
        assert_eq!(first.status, StatusCode::OK);
        let policies = list(&first.headers, "ratelimit-policy");
        let qu: Vec<Option<&Param>> = policies.iter().map(|m| m.params.get("qu")).collect();
        assert_eq!(
            qu,
            [
                None,
                Some(&Param::Str("content-bytes".into())),
                Some(&Param::Str("concurrent-requests".into())),
            ]
        );
        assert_eq!((policies[1].int("q"), policies[1].int("w")), (1_000, 60));
        assert!(
            !policies[2].params.contains_key("w"),
            "no window for concurrency"
        );
        let limits = list(&first.headers, "ratelimit");
        assert_eq!((limits[0].int("r"), limits[1].int("r")), (9, 400));

        let denied = send(&app, "erin", 600).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        let problem = denied.problem();
        assert_eq!(problem["violated-policies"], serde_json::json!(["upload"]));
        assert_eq!(send(&app, "erin", 400).await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn partition_keys_are_keyed_hashes_of_the_rule_key() {
    let layer = |keys: PartitionKeys| {
        app(
            ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, MIN).unwrap())
                .key(HeaderKey::new(HeaderName::from_static("x-user")))
                .headers_on_allowed(true)
                .partition_keys(keys),
        )
    };
    let pk = |r: Reply| list(&r.headers, "ratelimit")[0].params["pk"].clone();
    let shared = PartitionKeys::with_secret(SECRET);
    // Two replicas sharing a secret agree; a random key is another one.
    let a = pk(send(&layer(shared.clone()), "frank", 0).await);
    let b = pk(send(&layer(PartitionKeys::with_secret(SECRET)), "frank", 0).await);
    let c = pk(send(&layer(PartitionKeys::random()), "frank", 0).await);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, Param::Bytes(shared.of(b"frank").to_vec()));
    let Param::Bytes(raw) = a else { unreachable!() };
    assert_eq!(raw.len(), 16);
    assert!(!raw.windows(5).any(|w| w == b"frank"));
}

#[tokio::test]
async fn the_readme_sample_pk_and_the_layers_unit_for_its_first_rule() {
    let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, MIN).unwrap())
        .name("upload")
        .quota_unit(QuotaUnit::ContentBytes)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")).hashed())
        .headers_on_allowed(true)
        .partition_keys(PartitionKeys::with_secret(b"one secret for every replica"));
    let req = Request::post("/")
        .header("x-api-key", "k-123")
        .body(Body::empty())
        .unwrap();
    let r = app(layer).oneshot(req).await.unwrap();
    let policy = list(r.headers(), "ratelimit-policy");
    assert_eq!(policy[0].params["qu"], Param::Str("content-bytes".into()));
    // The value README.md shows: the digest `hashed()` keeps, hashed again.
    let ratelimit = r.headers()["ratelimit"].to_str().unwrap();
    assert!(
        ratelimit.ends_with(";pk=:cN2OqdiuOYoQuWgviEeNvA==:"),
        "{ratelimit}"
    );
}

#[tokio::test]
async fn other_rejections_stay_about_blank() {
    let layer = ThrottleLayer::new(MemoryStore::new(), Policy::sliding_log(5, MIN).unwrap())
        .key(HeaderKey::new(HeaderName::from_static("x-user")))
        .problem_json_body();
    let req = Request::post("/").body(Body::empty()).unwrap();
    let r = app(layer).oneshot(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "about:blank");
    assert_eq!(problem["status"], 401);
    assert!(problem.get("violated-policies").is_none());
}
