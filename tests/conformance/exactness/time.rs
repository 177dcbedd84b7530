//! Clocks that jump back, stall or sit at extremes through the `Limiter` and the layer; a full store.

use std::time::Duration;

use super::{manual_store, model_per_phase, policies, LIMIT, THREADS};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::decision::Receipt;
use tower_throttle::store::Charge;
use tower_throttle::{Limiter, MemoryStore, Policy};

// ------------------------------------------------------------------ time ---

/// Through the `Limiter`: a clock jumping back and stalling, with 8 threads.
#[test]
fn limiter_with_a_clock_jumping_back_never_admits_more_than_forward_time_allows() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for (name, policy) in policies() {
        let start = 1_700_000_000_000_000_000;
        let clock = ManualClock::starting_at(start);
        let limiter = Limiter::new(manual_store(&clock), policy);
        let mut admitted = 0u64;
        let mut forward = Duration::ZERO;
        let mut high = start;
        let mut last = None;
        for step in 0..2_000u64 {
            match step % 20 {
                // Back by 5 ms (never before the start): the state is ahead of now.
                13 => clock.set_ns(clock.now_ns().saturating_sub(5_000_000).max(start)),
                // Forward 1 ms, counted only past the highest time seen.
                0..=11 => {
                    clock.advance(Duration::from_millis(1));
                    if clock.now_ns() > high {
                        forward += Duration::from_nanos(clock.now_ns() - high);
                        high = clock.now_ns();
                    }
                }
                // Stalled.
                _ => {}
            }
            let d = rt.block_on(limiter.check("k")).unwrap();
            admitted += u64::from(d.allowed);
            last = d.receipt().or(last);
            // Peeks and refunds at odd times never panic.
            if step % 97 == 0 {
                if let Some(receipt) = last.take() {
                    rt.block_on(limiter.refund("k", &receipt)).unwrap();
                }
                let _ = rt.block_on(limiter.peek("k")).unwrap();
            }
        }
        // What the model admits checking every ms of the forward time, plus
        // one unit per refund.
        let refunds = 2_000 / 97 + 1;
        let mut steps = vec![Duration::from_millis(1); forward.as_millis() as usize];
        steps.push(Duration::ZERO);
        let bound: u64 = model_per_phase(&policy, start, &steps, 1_000)
            .iter()
            .sum::<u64>()
            + refunds;
        println!("{name}: clock back and stalled, admitted {admitted}, bound {bound}");
        assert!(admitted <= bound, "{name}: {admitted} > {bound}");
    }
}

/// Through the `ThrottleLayer`: the same clock faults, counted as 200 / 429.
#[tokio::test]
async fn layer_with_a_clock_jumping_back_never_admits_more() {
    use http::{Request, Response, StatusCode};
    use tower::{ServiceBuilder, ServiceExt};
    use tower_throttle::key::Global;
    use tower_throttle::ThrottleLayer;

    let start = 1_700_000_000_000_000_000;
    let clock = ManualClock::starting_at(start);
    let policy = Policy::cell(9, 10, Duration::from_secs(1)).unwrap(); // T = 100 ms, limit 10
    let svc = ServiceBuilder::new()
        .layer(ThrottleLayer::new(manual_store(&clock), policy).key(Global))
        .service_fn(|_req: Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        });
    let (mut ok, mut limited) = (0u64, 0u64);
    for step in 0..1_000u64 {
        if step % 10 == 9 {
            clock.set_ns(clock.now_ns().saturating_sub(5_000_000_000).max(start));
        } else {
            clock.advance(Duration::from_millis(1));
        }
        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        match res.status() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                limited += 1;
                let retry: u64 = res.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(retry >= 1, "Retry-After is never 0");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    // At most 900 ms of forward motion (never beyond the first 900 ms: the
    // jumps back cancel the rest): 10 + 9 admissions.
    println!("layer: clock back, 200 × {ok}, 429 × {limited}");
    assert!(ok <= 10 + 9, "{ok}");
    assert_eq!(ok + limited, 1_000);
}

#[test]
fn extreme_clocks_never_panic_through_the_limiter() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for start in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
        let clock = ManualClock::starting_at(start);
        for (name, policy) in policies() {
            let limiter = Limiter::new(manual_store(&clock), policy);
            for cost in [0, 1, LIMIT, LIMIT + 1, u64::MAX] {
                let d = rt.block_on(limiter.check_n("k", cost)).unwrap();
                assert!(d.remaining <= LIMIT, "{name} at {start}: {d:?}");
                if cost > LIMIT {
                    assert!(d.is_never(), "{name} at {start} cost {cost}: {d:?}");
                }
            }
            clock.set_ns(start / 2);
            let d = rt.block_on(limiter.check("k")).unwrap();
            // A receipt of every unit there is, from the far past.
            let forged = Receipt::new(u64::MAX, start / 2, d.permit);
            rt.block_on(limiter.refund("k", &forged)).unwrap();
            clock.set_ns(start);
            let _ = rt.block_on(limiter.peek("k")).unwrap();
        }
    }
}

/// A memory store that is full decides new keys on the rule's shared
/// overflow state, never panics, never evicts live state and never holds
/// more keys than its cap, with threads racing for the last slots.
#[test]
fn full_store_under_concurrency_never_exceeds_the_cap() {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .max_keys(1_000)
        .evict_when_full(false)
        .overflow_buckets(1)
        .shards(8)
        .sweep_interval(None)
        .build();
    let policy = Policy::cell(0, 1, Duration::from_secs(60)).unwrap();
    let handles: Vec<_> = (0..THREADS as u32)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut admitted = 0;
                for i in 0..1_000u32 {
                    let key = [t.to_le_bytes(), i.to_le_bytes()].concat();
                    match store.check_sync(Charge::new(&key, &policy, 1)) {
                        Ok(d) => admitted += usize::from(d.allowed),
                        Err(e) => panic!("{e}"),
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(store.len(), 1_000);
    // Every held key once, and the overflow state (1 a minute) once.
    assert_eq!(admitted, 1_001);
    assert_eq!(store.overflowed_checks() as usize, THREADS * 1_000 - 1_000);
}
