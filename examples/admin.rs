//! An API with rate limits and an admin endpoint that answers, for a user,
//! their state under every rule, and the hottest keys of the limiter.
//!
//! Run `cargo run --example admin` (add `--features redis` and set
//! `REDIS_URL=redis://127.0.0.1/` to keep the limits in Redis, with an
//! in-process fallback while it is down), then try the printed `curl`
//! lines. The API listens on 127.0.0.1, port `PORT` (default 3000); the
//! admin router on its own listener, 127.0.0.1 only, port `ADMIN_PORT`
//! (default 3001): never expose it where clients reach. The routers are in
//! `examples/admin/app.rs`, shared with the example's test.

use std::net::SocketAddr;

use tower_throttle::store::BoxStore;
use tower_throttle::MemoryStore;

#[path = "admin/app.rs"]
mod app;

fn port(var: &str, default: u16) -> u16 {
    std::env::var(var)
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(default)
}

/// The store: Redis with a fallback when `REDIS_URL` is set (feature
/// `redis`), else in process. Either way `Hottest` wraps it in
/// `app::limits`, so the hottest keys are counted whoever decides.
fn store() -> Result<BoxStore, Box<dyn std::error::Error>> {
    #[cfg(feature = "redis")]
    if let Ok(url) = std::env::var("REDIS_URL") {
        let redis = tower_throttle::RedisStore::builder()
            .timeout(std::time::Duration::from_millis(100))
            .connect_lazy(url.as_str())?;
        println!("limits in Redis at {url} (in process while it is down)");
        let fallback = tower_throttle::store::FallbackStore::new(redis, MemoryStore::new());
        return Ok(BoxStore::new(fallback));
    }
    #[cfg(not(feature = "redis"))]
    if std::env::var_os("REDIS_URL").is_some() {
        eprintln!("REDIS_URL is ignored: build with `--features axum,redis` to use Redis");
    }
    Ok(BoxStore::new(MemoryStore::new()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limits = app::limits(store()?)?;
    let api = tokio::net::TcpListener::bind(("127.0.0.1", port("PORT", 3000))).await?;
    let admin = tokio::net::TcpListener::bind(("127.0.0.1", port("ADMIN_PORT", 3001))).await?;
    let (api_url, admin_url) = (api.local_addr()?, admin.local_addr()?);
    println!("API on http://{api_url}, admin on http://{admin_url}\n");
    println!("  for i in $(seq 6); do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Authorization: Bearer alice' http://{api_url}/hello; done");
    println!("  curl -s http://{admin_url}/admin/limits/alice");
    println!("  curl -s 'http://{admin_url}/admin/limits/alice?ip=127.0.0.1'");
    println!("  curl -s http://{admin_url}/admin/hottest");
    println!("  curl -s -X DELETE 'http://{admin_url}/admin/limits/alice?ip=127.0.0.1'");
    // The API records each client's address for the per-address rule.
    let api_app = app::api(limits.clone()).into_make_service_with_connect_info::<SocketAddr>();
    tokio::try_join!(
        axum::serve(api, api_app),
        axum::serve(admin, app::admin(limits)),
    )?;
    Ok(())
}
