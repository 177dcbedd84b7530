//! One server killed and restarted, frozen and resumed; calls on a frozen server; a full batch queue.

use crate::redis_support;

use crate::faults;

use std::time::{Duration, Instant};

use super::load::Load;
use super::{
    assert_admitted_within_bound, assert_fault_outcomes, assert_no_task_leak, back_user,
    baseline_tasks, frozen_user, plain_user, policy, store_on, Phases, Via, BOUND, FAULT, MARGIN,
    TASKS, TIMEOUT, USERS,
};
use redis::aio::ConnectionLike;
use redis_support::{runtime, RedisServer};
use tower_throttle::store::redis::RedisStore;
use tower_throttle::store::Charge;
use tower_throttle::{Store, StoreError};

#[test]
fn server_killed_mid_load_then_restarted() {
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = store_on(server.url()).await;
        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let load = Load::start(store.clone(), origin, USERS, plain_user);
        tokio::time::sleep(Duration::from_millis(700)).await;

        let fault_start = origin.elapsed();
        load.next_generation();
        tokio::task::block_in_place(|| server.stop());
        tokio::time::sleep(FAULT).await;
        let undo_start = origin.elapsed();
        tokio::task::block_in_place(|| server.start_again());
        let fault_end = origin.elapsed();
        load.next_generation();
        tokio::time::sleep(Duration::from_millis(1800)).await;
        let recs = load.finish().await;

        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_fault_outcomes("kill", &recs, &phases);
        assert_admitted_within_bound("kill", &recs, &phases);
        assert_no_task_leak(baseline).await;
    });
}

#[test]
fn server_frozen_with_sigstop_then_resumed() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = store_on(server.url()).await;
        let baseline = baseline_tasks(&store).await;
        let origin = Instant::now();
        let mut recs = Load::start(store.clone(), origin, USERS, plain_user)
            .finish_after(Duration::from_millis(700))
            .await;

        // Quiet: count the scripts the server ran, then freeze it under load.
        let scripts_before = tokio::task::block_in_place(|| faults::script_calls(&server));
        let fault_start = origin.elapsed();
        let paused = tokio::task::block_in_place(|| faults::Paused::pause(&server));
        // Fresh keys, used only while frozen: whatever they hold afterwards
        // was charged by a stale check.
        let load = Load::start(store.clone(), origin, USERS, frozen_user);
        tokio::time::sleep(FAULT).await;
        let frozen = load.finish().await;
        let sent_while_frozen = frozen.iter().filter(|r| r.start >= fault_start).count();
        recs.extend(frozen);
        let undo_start = origin.elapsed();
        paused.resume();
        let fault_end = origin.elapsed();
        // What the woken server executes now was sent while it was frozen.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let scripts_after = tokio::task::block_in_place(|| faults::script_calls(&server));
        let stale = scripts_after - scripts_before;
        println!("sigstop: {sent_while_frozen} calls while frozen, {stale} executed after SIGCONT");

        let mut stale_units = 0;
        for via in [Via::Open, Via::Closed, Via::Store] {
            for user in 0..USERS {
                let key = match via {
                    Via::Open => format!("open:r:{}", frozen_user(user)),
                    Via::Closed => format!("closed:r:{}", frozen_user(user)),
                    Via::Store => format!("store:{}", frozen_user(user)),
                };
                let peek = store
                    .check(Charge::new(key.as_bytes(), &policy(), 0))
                    .await
                    .unwrap();
                stale_units += BOUND - peek.remaining;
            }
        }
        println!("sigstop: {stale_units} units charged by stale checks");
        // In flight when it froze: one check per task, and with batching one
        // more per task (a caller that timed out queues its next check before
        // its batch's own timeout trips the breaker). Without the breaker:
        // nearly every check sent while frozen.
        assert!(
            stale_units <= 2 * TASKS as u64,
            "{stale_units} units charged after SIGCONT by checks already answered"
        );
        assert!(
            stale <= 2 * TASKS as u64,
            "{stale} stale scripts ran after SIGCONT ({sent_while_frozen} calls while frozen): \
             commands queued while Redis was unresponsive"
        );
        // The frozen phase's records count as the fault's, under the plain users.
        for r in recs.iter_mut().filter(|r| r.start >= fault_start) {
            r.user += USERS;
        }
        let recs_before_recovery = recs.len();

        recs.extend(
            Load::start(store.clone(), origin, USERS, back_user)
                .finish_after(Duration::from_millis(1800))
                .await,
        );
        for r in &mut recs[recs_before_recovery..] {
            r.user += 2 * USERS;
        }
        let phases = Phases {
            fault_start,
            undo_start,
            fault_end,
        };
        assert_fault_outcomes("sigstop", &recs, &phases);
        assert_admitted_within_bound("sigstop", &recs, &phases);
        assert_no_task_leak(baseline).await;
    });
}
#[test]
fn store_calls_on_a_frozen_server_time_out_and_hold_nothing() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = store_on(server.url()).await;
        frozen_calls_time_out(&server, store).await;
    });
}

/// With a batch queue of one, callers wait for room within their store
/// timeout (backpressure), then fail with `StoreError::Timeout` like the
/// others: none waits longer, none fails otherwise.
#[test]
fn a_full_batch_queue_makes_callers_wait_then_time_out() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let store = RedisStore::builder()
            .prefix("f")
            .timeout(TIMEOUT)
            .batch_queue(1)
            .connect(server.url())
            .await
            .unwrap();
        frozen_calls_time_out(&server, store).await;
    });
}

/// Freezes `server` under 64 concurrent calls: each fails with a timeout
/// within the bound, a plain command through the connection is bounded
/// too, and the store answers again within a second of the server.
async fn frozen_calls_time_out(server: &RedisServer, store: RedisStore) {
    let p = policy();
    assert!(store.check(Charge::new(b"k", &p, 1)).await.unwrap().allowed);
    let paused = tokio::task::block_in_place(|| faults::Paused::pause(server));
    // Many concurrent calls, each bounded by the timeout.
    let t0 = Instant::now();
    let calls: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("k{i}");
                let t = Instant::now();
                let r = store.check(Charge::new(key.as_bytes(), &policy(), 1)).await;
                (t.elapsed(), r.map(|d| d.allowed))
            })
        })
        .collect();
    for c in calls {
        let (took, r) = c.await.unwrap();
        assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
        assert!(took <= TIMEOUT + MARGIN, "{took:?}");
    }
    assert!(t0.elapsed() <= TIMEOUT + MARGIN, "{:?}", t0.elapsed());
    // A plain command through the same connection is bounded too.
    let mut conn = store.connection().clone();
    let ping = tokio::time::timeout(TIMEOUT + MARGIN, async {
        conn.req_packed_command(&redis::cmd("PING")).await
    })
    .await;
    assert!(
        !matches!(ping, Ok(Ok(_))),
        "a frozen server answered PING: {ping:?}"
    );
    paused.resume();
    let t = Instant::now();
    loop {
        match store.check(Charge::new(b"k", &p, 1)).await {
            Ok(d) => {
                assert!(d.allowed);
                break;
            }
            Err(e) => assert!(t.elapsed() < Duration::from_secs(1), "no recovery: {e:?}"),
        }
    }
}
