//! The load: tasks cycling through the open layer, the closed layer and the store.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{handler, policy, Rec, Via, TASKS};
use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_throttle::key::HeaderKey;
use tower_throttle::store::Charge;
use tower_throttle::{FailMode, Store, ThrottleLayer};

/// Load on one store: `TASKS` tasks, each cycling through the open layer, the
/// closed layer and the store, until stopped.
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    /// Bumped to move the load to fresh keys: user `u` of generation `g` is
    /// `g * users + u`. Keys already denied are answered from the store's
    /// local denial cache whatever the server's state, so each fault is met
    /// with keys the store has not denied yet.
    generation: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Vec<Rec>>>,
}

impl Load {
    pub(super) fn start<St>(
        store: St,
        origin: Instant,
        users: usize,
        user_key: fn(usize) -> String,
    ) -> Load
    where
        St: Store + Clone,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicUsize::new(0));
        let layer = |fail: FailMode, prefix: &str| {
            ThrottleLayer::new(store.clone(), policy())
                .name("r")
                .key(HeaderKey::new(http::HeaderName::from_static("x-user")))
                .prefix(prefix)
                .fail_mode(fail)
        };
        let open = ServiceBuilder::new()
            .layer(layer(FailMode::Open, "open"))
            .service(handler());
        let closed = ServiceBuilder::new()
            .layer(layer(FailMode::Closed, "closed"))
            .service(handler());
        let tasks = (0..TASKS)
            .map(|task| {
                let (open, closed, store, stop, generation) = (
                    open.clone(),
                    closed.clone(),
                    store.clone(),
                    stop.clone(),
                    generation.clone(),
                );
                tokio::spawn(async move {
                    let policy = policy();
                    let mut recs = Vec::new();
                    let mut n = task;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let user = generation.load(Ordering::Relaxed) * users + n % users;
                        for via in [Via::Open, Via::Closed, Via::Store] {
                            let req = Request::builder()
                                .header("x-user", user_key(user))
                                .body(())
                                .unwrap();
                            let start = origin.elapsed();
                            let status = match via {
                                Via::Open => open.clone().oneshot(req).await.unwrap().status(),
                                Via::Closed => closed.clone().oneshot(req).await.unwrap().status(),
                                Via::Store => {
                                    let key = format!("store:{}", user_key(user));
                                    match store.check(Charge::new(key.as_bytes(), &policy, 1)).await
                                    {
                                        Ok(d) if d.allowed => StatusCode::OK,
                                        Ok(_) => StatusCode::TOO_MANY_REQUESTS,
                                        Err(e) if e.is_unavailable() => {
                                            StatusCode::SERVICE_UNAVAILABLE
                                        }
                                        Err(e) => panic!("unexpected store error: {e:?}"),
                                    }
                                }
                            };
                            recs.push(Rec {
                                start,
                                end: origin.elapsed(),
                                via,
                                user,
                                status: status.as_u16(),
                            });
                        }
                        // Pacing only (a dead server fails fast): not synchronisation.
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    recs
                })
            })
            .collect();
        Load {
            stop,
            generation,
            tasks,
        }
    }

    /// Moves the load to fresh keys.
    pub(super) fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops the tasks and gathers their records; a panicking task fails the test.
    pub(super) async fn finish(self) -> Vec<Rec> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.expect("a load task panicked"));
        }
        all
    }
}

impl Load {
    pub(super) async fn finish_after(self, after: Duration) -> Vec<Rec> {
        tokio::time::sleep(after).await;
        self.finish().await
    }
}
