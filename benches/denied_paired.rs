//! What a denied request costs against an allowed one, in process,
//! measured in alternation within one process: each round sends a batch
//! through four stacks in a rotating order — a bare `text/plain` handler
//! (axum's `"ok".into_response()`, the shape of the layer's 429), the same
//! behind `ThrottleLayer` with 10,000 users round robin (every request
//! allowed), and behind `ThrottleLayer` with one user whose quota is spent
//! (every request answered 429), and a bare empty handler — and the ratio
//! denied ÷ allowed is taken within the round. Drift of the machine hits
//! the stacks of a round alike.
//!
//! `cargo bench --bench denied_paired`; `PAIRED_ROUNDS` (default 61),
//! `PAIRED_BATCH` (requests per stack and round, default 20,000) and
//! `PAIRED_MAX_SECS` (default 120) bound the run. `PAIRED_ONLY` (0 bare
//! text, 1 allowed, 2 denied, 3 bare empty) runs one stack alone, for a
//! profiler.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::IntoResponse;
use http::{Request, Response};
use tower::{Layer, Service};
use tower_throttle::key::HeaderKey;
use tower_throttle::{MemoryStore, Policy, ThrottleLayer};

#[path = "common/user_header.rs"]
#[allow(dead_code)]
mod user_header;
use user_header::USER;

#[path = "common/traffic.rs"]
mod traffic;
use traffic::{env, inner, quantile, users};

const USERS: usize = 10_000;

/// A handler answering `"ok"` as axum does: with a `content-type` header.
fn text_inner() -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone
{
    tower::service_fn(|_req: Request<Body>| async { Ok("ok".into_response()) })
}

fn main() {
    let rounds = env("PAIRED_ROUNDS", 61).max(1) as usize;
    let n = env("PAIRED_BATCH", 20_000).max(1) as usize;
    let deadline = Instant::now() + Duration::from_secs(env("PAIRED_MAX_SECS", 120));
    let only = std::env::var("PAIRED_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let many = users(USERS);
    let one = many[..1].to_vec();
    let layer = |burst: u64| {
        ThrottleLayer::new(
            MemoryStore::new(),
            Policy::cell(burst, 1, Duration::from_secs(1)).unwrap(),
        )
        .key(HeaderKey::new(USER))
    };
    let mut bare_text = text_inner();
    let mut allowed = layer(999_999).layer(text_inner());
    // One request a second for the one user: all but about one request a
    // second is answered 429.
    let mut denied = layer(0).layer(text_inner());
    let mut bare_empty = inner();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        traffic::batch(&mut bare_text, &USER, &many, USERS).await;
        traffic::batch(&mut allowed, &USER, &many, USERS * 2).await;
        traffic::batch(&mut denied, &USER, &one, USERS).await;
        traffic::batch(&mut bare_empty, &USER, &many, USERS).await;
    });
    let mut times: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        if Instant::now() > deadline {
            eprintln!("stopped after {round} rounds: PAIRED_MAX_SECS reached");
            break;
        }
        for k in 0..4 {
            let which = (round + k) % 4;
            if only.is_some_and(|o| o != which) {
                times[which].push(1.0);
                continue;
            }
            let t = rt.block_on(async {
                match which {
                    0 => traffic::batch(&mut bare_text, &USER, &many, n).await,
                    1 => traffic::batch(&mut allowed, &USER, &many, n).await,
                    2 => traffic::batch(&mut denied, &USER, &one, n).await,
                    _ => traffic::batch(&mut bare_empty, &USER, &many, n).await,
                }
            });
            times[which].push(t);
        }
    }
    let done = times[0].len();
    let mut ratio: Vec<f64> = (0..done).map(|i| times[2][i] / times[1][i]).collect();
    let mut margin: Vec<f64> = (0..done).map(|i| times[2][i] - times[1][i]).collect();
    let not_above = margin.iter().filter(|&&d| d <= 0.0).count();
    let [bare_text, allowed, denied, bare_empty] = &mut times;
    println!("denied_paired: {done} rounds of {n} requests per stack");
    println!(
        "ns/request, median: bare text handler {:.1}, allowed (10k users, text handler) {:.1}, \
         denied (one user, 429) {:.1}, bare empty handler {:.1}",
        quantile(bare_text, 0.5),
        quantile(allowed, 0.5),
        quantile(denied, 0.5),
        quantile(bare_empty, 0.5),
    );
    println!(
        "denied / allowed, per round: median {:.3} (quartiles {:.3} .. {:.3}); \
         denied - allowed: median {:+.1} ns",
        quantile(&mut ratio, 0.5),
        quantile(&mut ratio, 0.25),
        quantile(&mut ratio, 0.75),
        quantile(&mut margin, 0.5),
    );
    println!("rounds where a denial cost no more than an admission: {not_above}/{done}");
}
