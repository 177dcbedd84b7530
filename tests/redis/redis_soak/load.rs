//! The soak's load: four routes on one store, and the workers that send
//! them requests for random users, some cut off at a random point.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Layer, ServiceExt};
use tower_throttle::key::{Global, HeaderKey};
use tower_throttle::store::redis::RedisStore;
use tower_throttle::{Limiter, ThrottleLayer};

use super::{gcra, log, request, slots, Rng, Running, Tally, ANSWER_BOUND, STORE_TIMEOUT, USERS};

/// One request's answer: its route and status.
pub(super) type Answer = Pin<Box<dyn Future<Output = (&'static str, u16)> + Send>>;

/// The routes, as one call `(route, user)`: GCRA per user (fail closed),
/// the same fail open with a layer timeout shorter than the store's, a
/// concurrency limit, and the direct API.
pub(super) fn routes(
    store: &RedisStore,
    tally: &Arc<Tally>,
) -> impl Fn(u64, usize) -> Answer + Clone + Send + 'static {
    let ok = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
    });
    let per_user = ThrottleLayer::new(store.clone(), gcra())
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .prefix("gcra")
        .fail_closed()
        .layer(ok);
    let open = ThrottleLayer::new(store.clone(), gcra())
        .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
        .prefix("open")
        .fail_open()
        .store_timeout(Duration::from_millis(30))
        .layer(ok);
    let held = {
        let tally = tally.clone();
        tower::service_fn(move |_req: Request<()>| {
            let tally = tally.clone();
            async move {
                let _running = Running::start(tally);
                tokio::time::sleep(Duration::from_millis(3)).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            }
        })
    };
    let concurrent = ThrottleLayer::new(store.clone(), slots())
        .key(Global)
        .prefix("slots")
        .fail_closed()
        .layer(held);
    let direct = Arc::new(Limiter::new(store.clone(), log()).with_prefix("direct"));
    let tally = tally.clone();
    move |route, user| {
        let (tally2, per_user, open, concurrent, direct) = (
            tally.clone(),
            per_user.clone(),
            open.clone(),
            concurrent.clone(),
            direct.clone(),
        );
        Box::pin(async move {
            match route {
                0 => {
                    let s = per_user.oneshot(request(user)).await.unwrap().status();
                    if s == StatusCode::OK {
                        tally2.gcra_admitted[user].fetch_add(1, Ordering::SeqCst);
                    }
                    assert!([200, 429, 503].contains(&s.as_u16()), "fail closed: {s}");
                    ("gcra", s.as_u16())
                }
                1 => {
                    let s = open.oneshot(request(user)).await.unwrap().status();
                    assert!([200, 429].contains(&s.as_u16()), "fail open: {s}");
                    ("open", s.as_u16())
                }
                2 => {
                    let s = concurrent.oneshot(request(user)).await.unwrap().status();
                    assert!([200, 429, 503].contains(&s.as_u16()), "fail closed: {s}");
                    ("slots", s.as_u16())
                }
                _ => match direct.check(format!("user-{user}")).await {
                    Ok(d) if d.allowed => {
                        tally2.log_admitted[user].fetch_add(1, Ordering::SeqCst);
                        ("direct", 200)
                    }
                    Ok(_) => ("direct", 429),
                    Err(_) => ("direct", 503),
                },
            }
        })
    }
}

/// One worker: requests on random routes until stopped, bounded in count
/// as well as in time; one in five is cut off at a random point.
pub(super) async fn worker(
    w: u64,
    send: impl Fn(u64, usize) -> Answer,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    inflight_tasks: Arc<AtomicUsize>,
) {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (w + 1));
    let mut sent = 0u64;
    // Bounded in count as well as in time.
    while !stop.load(Ordering::Relaxed) && sent < 20_000 {
        sent += 1;
        let user = rng.below(USERS as u64) as usize;
        // One request in five is cut off at a random point.
        let cancel_after = (rng.below(5) == 0).then(|| Duration::from_micros(rng.below(4_000)));
        let route = rng.below(4);
        let started = Instant::now();
        inflight_tasks.fetch_add(1, Ordering::SeqCst);
        let work = send(route, user);
        match cancel_after {
            Some(after) => {
                if tokio::time::timeout(after, work).await.is_err() {
                    tally.cancelled.fetch_add(1, Ordering::Relaxed);
                }
            }
            None => {
                let (route, status) = tokio::time::timeout(STORE_TIMEOUT + ANSWER_BOUND * 2, work)
                    .await
                    .expect("a request was never answered");
                tally.answered_in(started.elapsed(), route);
                tally.status(route, status);
            }
        }
        inflight_tasks.fetch_sub(1, Ordering::SeqCst);
        // Pace the load a little so the machine stays responsive.
        if sent.is_multiple_of(8) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
