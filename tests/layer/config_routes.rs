//! One limits file for a whole service (feature `config`): named routes,
//! each a layer, loaded and checked together and swapped at once.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, Service, ServiceExt};
use tower_throttle::clock::ManualClock;
use tower_throttle::config::{RuleTable, ServiceConfig};
use tower_throttle::MemoryStore;

const SERVICE: &str = "\
routes:
  reply:
    key: { header: x-user-id }
    rules:
      - name: per-minute
        policy: { sliding_log: { limit: 2, window: 60s } }
  post:
    prefix: posts
    key: { header: x-user-id }
    rules:
      - name: per-hour
        policy: { fixed_window: { limit: 1, window: 1h } }
";

fn frozen() -> MemoryStore<ManualClock> {
    MemoryStore::builder().clock(ManualClock::new()).build()
}

fn ok(
) -> impl Service<Request<()>, Response = Response<Full<Bytes>>, Error = Infallible, Future: Send> + Clone
{
    tower::service_fn(|_: Request<()>| async { Ok(Response::new(Full::new(Bytes::new()))) })
}

fn from(user: &str) -> Request<()> {
    Request::builder()
        .header("x-user-id", user)
        .body(())
        .unwrap()
}

async fn status<S>(svc: &mut S, user: &str) -> StatusCode
where
    S: Service<Request<()>, Response = Response<tower_throttle::body::ThrottleBody<Full<Bytes>>>>,
    S::Error: std::fmt::Debug,
{
    svc.ready()
        .await
        .unwrap()
        .call(from(user))
        .await
        .unwrap()
        .status()
}

/// Each route limits its own requests on its own counters: replies do not
/// spend posts. A route without `prefix` takes its name.
#[tokio::test]
async fn each_route_limits_with_its_own_counters() {
    let config = ServiceConfig::parse("service.yaml", SERVICE).unwrap();
    let table = RuleTable::new(frozen(), config).unwrap();
    let mut reply = table.layer("reply").unwrap().layer(ok());
    let mut post = table.layer("post").unwrap().layer(ok());
    assert_eq!(status(&mut reply, "ann").await, StatusCode::OK);
    assert_eq!(status(&mut reply, "ann").await, StatusCode::OK);
    assert_eq!(
        status(&mut reply, "ann").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&mut post, "ann").await,
        StatusCode::OK,
        "replies spent no post"
    );
    assert_eq!(
        status(&mut post, "ann").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let reply_layer = table.current("reply").unwrap();
    let state = reply_layer.peek("ann").await.unwrap();
    assert_eq!(state.get("per-minute").unwrap().remaining, 0);
    let config = table.config();
    assert_eq!(
        config.route("reply").unwrap().prefix.as_deref(),
        Some("reply")
    );
    assert_eq!(
        config.route("post").unwrap().prefix.as_deref(),
        Some("posts")
    );
}

/// An unknown route is an error when the layer is asked for, naming the
/// routes the file has.
#[test]
fn an_unknown_route_is_an_error_before_traffic() {
    let table = RuleTable::new(frozen(), ServiceConfig::parse("s.yaml", SERVICE).unwrap()).unwrap();
    let e = table.layer("replies").unwrap_err();
    assert!(
        e.to_string()
            .contains("no route `replies`; the file has post, reply"),
        "{e}"
    );
}

/// Two routes on one namespace are refused, naming both; so is a file with
/// no route, or a bad route name.
#[test]
fn routes_are_checked_against_each_other() {
    let clash = SERVICE
        .replace("prefix: posts", "prefix: reply")
        .replace("per-hour", "per-minute");
    let e = ServiceConfig::parse("s.yaml", &clash).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("routes.reply.rules[0]"), "{e}");
    assert!(e.message.contains("routes.post.rules[0]"), "{e}");
    let e = ServiceConfig::parse("s.yaml", "routes: {}").unwrap_err();
    assert!(e.message.contains("at least one route"), "{e}");
    let e = ServiceConfig::parse(
        "s.yaml",
        "routes: { 'a b': { rules: [{ name: x, policy: { fixed_window: { limit: 1, window: 1s } } }] } }",
    ).unwrap_err();
    assert!(e.message.contains("route name"), "{e}");
}

/// An error inside a route names the route, the field and the line; a rule
/// the store refuses names its route too.
#[test]
fn an_error_in_a_route_names_route_field_and_line() {
    let bad = SERVICE.replace("limit: 1, window: 1h", "limit: 0, window: 1h");
    let e = ServiceConfig::parse("s.yaml", &bad).unwrap_err();
    assert_eq!(
        e.field.as_deref(),
        Some("routes.post.rules[0].policy"),
        "{e}"
    );
    assert_eq!(e.line, Some(12), "{e}");

    // Two tables on one store: the second file's `post` route takes the
    // first's namespace.
    let store = frozen();
    let first = RuleTable::new(
        store.clone(),
        ServiceConfig::parse("a.yaml", SERVICE).unwrap(),
    )
    .unwrap();
    let other = "routes:\n  other:\n    prefix: posts\n    rules: [{ name: per-hour, policy: { fixed_window: { limit: 5, window: 1h } } }]\n";
    let e = RuleTable::new(store, ServiceConfig::parse("b.yaml", other).unwrap()).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("routes.other.rules[0]"), "{e}");
    drop(first);
}

/// A reload swaps every route at once, keeps the counters of rules that
/// stay, and is refused when it drops a route the service uses (the
/// running limits stay); a route no one uses may go.
#[tokio::test]
async fn a_reload_swaps_all_routes_and_keeps_the_ones_in_use() {
    let table = RuleTable::new(frozen(), ServiceConfig::parse("s.yaml", SERVICE).unwrap()).unwrap();
    let mut reply = table.layer("reply").unwrap().layer(ok());
    assert_eq!(status(&mut reply, "ann").await, StatusCode::OK);

    let without_reply = "routes:\n  post:\n    prefix: posts\n    rules: [{ name: per-hour, policy: { fixed_window: { limit: 1, window: 1h } } }]\n";
    let e = table
        .reload(ServiceConfig::parse("s.yaml", without_reply).unwrap())
        .unwrap_err();
    assert_eq!(e.field.as_deref(), Some("routes.reply"), "{e}");
    assert!(e.message.contains("serves requests"), "{e}");
    assert_eq!(table.generation(), 0);

    // `post` was never handed out: a file without it is accepted, and the
    // reply route's raised limit applies to what it already counted.
    let raised = "routes:\n  reply:\n    key: { header: x-user-id }\n    rules: [{ name: per-minute, policy: { sliding_log: { limit: 3, window: 60s } } }]\n";
    table
        .reload(ServiceConfig::parse("s.yaml", raised).unwrap())
        .unwrap();
    assert_eq!(table.generation(), 1);
    assert!(table.config().route("post").is_none());
    assert_eq!(status(&mut reply, "ann").await, StatusCode::OK);
    assert_eq!(status(&mut reply, "ann").await, StatusCode::OK);
    assert_eq!(
        status(&mut reply, "ann").await,
        StatusCode::TOO_MANY_REQUESTS,
        "3 in all"
    );
}

/// The same file in TOML and JSON reads the same routes.
#[test]
fn routes_read_the_same_in_every_format() {
    use tower_throttle::config::Format;
    let toml = r#"
[routes.reply]
key = { header = "x-user-id" }
rules = [{ name = "per-minute", policy = { sliding_log = { limit = 2, window = "60s" } } }]
[routes.post]
prefix = "posts"
key = { header = "x-user-id" }
rules = [{ name = "per-hour", policy = { fixed_window = { limit = 1, window = "1h" } } }]
"#;
    let json = r#"{"routes": {
 "reply": {"key": {"header": "x-user-id"}, "rules": [{"name": "per-minute", "policy": {"sliding_log": {"limit": 2, "window": "60s"}}}]},
 "post": {"prefix": "posts", "key": {"header": "x-user-id"}, "rules": [{"name": "per-hour", "policy": {"fixed_window": {"limit": 1, "window": "1h"}}}]}}}"#;
    let read = [
        ServiceConfig::parse_as("s.yaml", SERVICE, Format::Yaml).unwrap(),
        ServiceConfig::parse_as("s.toml", toml, Format::Toml).unwrap(),
        ServiceConfig::parse_as("s.json", json, Format::Json).unwrap(),
    ];
    for config in &read {
        let routes: Vec<(&str, Option<&str>, u64)> = config
            .routes()
            .map(|(name, l)| (name, l.prefix.as_deref(), l.rules[0].policy.0.limit()))
            .collect();
        assert_eq!(
            routes,
            [("post", Some("posts"), 1), ("reply", Some("reply"), 2)]
        );
    }
}

/// README's limits file loads as it is, with the extractors README
/// registers, and does what its comments say.
#[tokio::test]
async fn the_readme_limits_file_loads_and_limits_as_it_says() {
    use tower_throttle::config::Extractors;
    use tower_throttle::key::FromExtension;

    #[derive(Clone)]
    struct UserId(u64);
    impl std::fmt::Display for UserId {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.0)
        }
    }
    #[derive(Clone)]
    struct Plan(&'static str);
    impl std::fmt::Display for Plan {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme
        .find("# limits.yaml: one route")
        .expect("README's limits file");
    let text = &readme[start..];
    let text = &text[..text.find("```").unwrap()];
    let extractors = Extractors::new()
        .with("user_id", FromExtension::<UserId>::new())
        .with("plan", FromExtension::<Plan>::new());
    let config = ServiceConfig::parse("README.md", text).unwrap();
    let table = RuleTable::with_extractors(frozen(), config, extractors).unwrap();
    let mut reply = table.layer("reply").unwrap().layer(ok());
    let as_user = |id| {
        let mut req = Request::builder().uri("/reply").body(()).unwrap();
        req.extensions_mut().insert(UserId(id));
        req
    };
    for _ in 0..5 {
        let r = reply.ready().await.unwrap().call(as_user(7)).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = reply.ready().await.unwrap().call(as_user(7)).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // A header saying another user changes nothing; no user id at all: 401.
    let mut spoofed = as_user(7);
    spoofed
        .headers_mut()
        .insert("x-user-id", "8".parse().unwrap());
    let r = reply.ready().await.unwrap().call(spoofed).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let anonymous = Request::builder().uri("/reply").body(()).unwrap();
    let r = reply.ready().await.unwrap().call(anonymous).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(table.layer("completions").is_ok());
}
