//! A UGC site's API with every limit of the design:
//!
//! * replies: 5 a minute AND 100 a day per user (exact sliding log + window);
//!   premium users (a token containing `premium`) 50 a minute AND 1000 a day,
//!   chosen per request from the tier the auth layer records;
//! * posts: a funnel of 15 that leaks 30 an hour per user;
//! * likes: a token bucket of 10 refilled at 1/s per user, waiting up to 1 s;
//! * uploads: at most 2 in flight per user;
//! * everything: 300 requests a minute per client IP (GCRA: a burst of 300,
//!   then one every 200 ms), headers on every response.
//!
//! Run `cargo run --example ugc` (add `--features redis` and set
//! `REDIS_URL=redis://127.0.0.1/` to share the limits between instances;
//! it starts with Redis down too, and moves the limits there once Redis
//! answers), then try the printed `curl` lines. It listens on 127.0.0.1, port `PORT`
//! (default 3000). A 429's `RateLimit` `t` is the seconds until the next
//! unit of quota (a post's is at most its `Retry-After`), not until the key
//! is fully fresh.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tower_throttle::key::{FromExtension, PeerIp};
use tower_throttle::mode::OnMissingKey;
use tower_throttle::store::BoxStore;
use tower_throttle::{MemoryStore, Policy, RateLimitInfo, Rule, Store, ThrottleLayer};

/// The signed-in user, as an auth layer would record it.
#[derive(Clone, Debug)]
struct UserId(String);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The user's plan, as an auth layer would record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    Free,
    Premium,
}

/// Demo authentication: `Authorization: Bearer <user>` signs in as `<user>`,
/// on the premium plan when the token contains `premium`. A real app
/// verifies the token here and inserts the user and plan it names.
async fn auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|u| !u.is_empty() && u.len() <= 64)
        .map(|u| UserId(u.to_owned()));
    if let Some(user) = user {
        let tier = if user.0.contains("premium") {
            Tier::Premium
        } else {
            Tier::Free
        };
        req.extensions_mut().insert(user);
        req.extensions_mut().insert(tier);
    }
    next.run(req).await
}

async fn reply(Extension(info): Extension<RateLimitInfo>) -> String {
    let minute = info.get("minute").map_or(0, |d| d.remaining);
    let day = info.get("day").map_or(0, |d| d.remaining);
    format!("replied ({minute} more this minute, {day} today)\n")
}

async fn post_story(Extension(info): Extension<RateLimitInfo>) -> String {
    match info.decision() {
        Some(d) => format!("posted ({} left in the funnel)\n", d.remaining),
        // Let through unchecked (no key, or the store failed open).
        None => format!("posted (not limited: {:?})\n", info.not_limited()),
    }
}

async fn like() -> &'static str {
    "liked\n"
}

async fn upload() -> &'static str {
    tokio::time::sleep(Duration::from_secs(3)).await; // a slow upload
    "uploaded\n"
}

async fn home() -> &'static str {
    "tower-throttle UGC demo\n"
}

fn app<St: Store>(store: Arc<St>) -> Result<Router, tower_throttle::PolicyError> {
    let per_user = || FromExtension::<UserId>::new();
    let signed_in = OnMissingKey::Reject(StatusCode::UNAUTHORIZED);

    // Free limits are the rules' own; premium ones are chosen per request.
    let premium_minute = Policy::sliding_log(50, Duration::from_secs(60))?;
    let premium_day = Policy::fixed_window(1000, Duration::from_secs(86_400))?;
    let replies = ThrottleLayer::new(
        store.clone(),
        Policy::sliding_log(5, Duration::from_secs(60))?,
    )
    .name("minute")
    .policy_from_extension(move |tier: &Tier| (*tier == Tier::Premium).then_some(premium_minute))
    .and(
        Rule::new(
            "day",
            Policy::fixed_window(100, Duration::from_secs(86_400))?,
        )
        .policy_from_extension(move |tier: &Tier| (*tier == Tier::Premium).then_some(premium_day)),
    )
    .key(per_user())
    .prefix("reply")
    .on_missing_key(signed_in)
    .legacy_headers(true)
    .headers_on_allowed(true)
    .request_info(true);
    let posts = ThrottleLayer::new(store.clone(), Policy::funnel(15, 30.0 / 3600.0)?)
        .key(per_user())
        .prefix("post")
        .on_missing_key(signed_in)
        .problem_json_body()
        .request_info(true);
    let likes = ThrottleLayer::new(store.clone(), Policy::token_bucket(10, 1.0)?)
        .key(per_user())
        .prefix("like")
        .on_missing_key(signed_in)
        .delay_up_to(Duration::from_secs(1));
    let uploads = ThrottleLayer::new(store.clone(), Policy::concurrency(2)?)
        .key(per_user())
        .prefix("upload")
        .on_missing_key(signed_in);
    // GCRA, so the `t` a client reads is when its next request's worth of
    // quota is back (1 s while it has room; a sliding window's `t` may
    // exceed the window, as its current count only ages out in the next one).
    let per_ip = ThrottleLayer::new(store, Policy::cell(299, 300, Duration::from_secs(60))?)
        .name("per-ip")
        .key(PeerIp::new())
        .prefix("ip")
        .headers_on_allowed(true);

    Ok(Router::new()
        .route("/", get(home))
        .route("/reply", post(reply).route_layer(replies))
        .route("/post", post(post_story).route_layer(posts))
        .route("/like", post(like).route_layer(likes))
        .route("/upload", post(upload).route_layer(uploads))
        // Layers run outside in: the per-IP limit first, then auth, then each route's.
        .layer(middleware::from_fn(auth))
        .layer(per_ip))
}

async fn serve(router: Router) -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let url = format!("http://{}", listener.local_addr()?);
    println!("UGC demo listening on {url}\n");
    println!("  # the 6th reply within a minute gets 429 with Retry-After and RateLimit headers");
    println!("  for i in 1 2 3 4 5 6; do curl -si -X POST -H 'Authorization: Bearer alice' {url}/reply | head -n 1; done");
    println!("  curl -si -X POST -H 'Authorization: Bearer alice' {url}/reply");
    println!("  # tiers: a free user's 6th reply is refused (q=5), a premium user's is not (q=50)");
    println!("  for i in $(seq 6); do curl -si -X POST -H 'Authorization: Bearer dave' {url}/reply | grep -i -e '^HTTP' -e '^ratelimit-policy: \"minute'; done");
    println!("  for i in $(seq 6); do curl -si -X POST -H 'Authorization: Bearer erin-premium' {url}/reply | grep -i -e '^HTTP' -e '^ratelimit-policy: \"minute'; done");
    println!("  # another user has their own quota; no user is a 401");
    println!("  curl -si -X POST -H 'Authorization: Bearer bob' {url}/reply");
    println!("  curl -si -X POST {url}/reply");
    println!("  # posts: a funnel of 15, problem+json when full");
    println!("  for i in $(seq 16); do curl -s -X POST -H 'Authorization: Bearer alice' {url}/post; done");
    println!("  # likes: past 10 at once, each waits up to 1 s for a token");
    println!("  for i in $(seq 12); do curl -s -X POST -H 'Authorization: Bearer alice' {url}/like; done");
    println!("  # uploads: a third concurrent one is refused");
    println!("  for i in 1 2 3; do curl -s -X POST -H 'Authorization: Bearer alice' {url}/upload & done; wait");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ---- Store selection at run time: a BoxStore, so `app` is not generic
    // over it. With REDIS_URL (feature `redis`), Redis decides and an
    // in-process store answers while Redis is down, including at startup:
    // the store connects in the background and Redis decides once it
    // answers, without a restart. ----
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        use tower_throttle::store::FallbackStore;
        // Fails here only for what needs no server (a malformed URL).
        let redis = tower_throttle::RedisStore::builder()
            .timeout(Duration::from_millis(100))
            .connect_lazy(url.as_str())?;
        println!(
            "limits in Redis at {url} once it answers; until then, and while it is down, \
             each instance limits in process (up to instances × each limit)"
        );
        let store = BoxStore::new(FallbackStore::new(redis, MemoryStore::new()));
        return serve(app(Arc::new(store))?).await;
    }
    #[cfg(not(feature = "redis"))]
    if std::env::var_os("REDIS_URL").is_some() {
        eprintln!("REDIS_URL is ignored: build with `--features axum,redis` to use Redis");
    }
    serve(app(Arc::new(BoxStore::new(MemoryStore::new())))?).await
}
