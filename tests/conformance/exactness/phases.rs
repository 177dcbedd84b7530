//! Threads on one key admit exactly the model phase by phase; free-running clocks; multi-rule charges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::{
    manual_store, model_per_phase, policies, schedule, LIMIT, PER_PHASE, PER_THREAD, PHASES,
    THREADS,
};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::Charge;
use tower_throttle::Policy;

#[test]
fn eight_threads_admit_exactly_the_model_phase_by_phase() {
    let steps = schedule(PHASES);
    for (name, policy) in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = manual_store(&clock);
        let want = model_per_phase(&policy, clock.now_ns(), &steps, THREADS * PER_PHASE);
        let got: Arc<Vec<AtomicU64>> = Arc::new((0..PHASES).map(|_| AtomicU64::new(0)).collect());
        let barrier = Arc::new(Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, clock, got, barrier, steps) = (
                    store.clone(),
                    clock.clone(),
                    got.clone(),
                    barrier.clone(),
                    steps.clone(),
                );
                std::thread::spawn(move || {
                    for (phase, step) in steps.iter().enumerate() {
                        barrier.wait();
                        let mut admitted = 0;
                        for _ in 0..PER_PHASE {
                            let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                            admitted += u64::from(d.allowed);
                        }
                        got[phase].fetch_add(admitted, Ordering::Relaxed);
                        barrier.wait();
                        // One thread moves time, while nobody checks.
                        if thread == 0 {
                            clock.advance(*step);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a checking thread panicked");
        }
        let got: Vec<u64> = got.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let (total, bound) = (got.iter().sum::<u64>(), want.iter().sum::<u64>());
        println!(
            "{name}: {} checks, admitted {total}, model {bound}",
            THREADS * PER_THREAD
        );
        for (phase, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{name}: phase {phase} admitted {g}, model {w}");
        }
        assert_eq!(total, bound, "{name}");
    }
}

/// The clock advances while the threads check (no phases): every check sees
/// some instant of the schedule, so the model checking greedily at every one
/// of them bounds what can be admitted.
#[test]
fn free_running_clock_never_admits_more_than_the_model() {
    let steps: Vec<Duration> = schedule(400);
    for (name, policy) in policies() {
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let store = manual_store(&clock);
        // The model checks before each step, so a last zero step covers the
        // instant after the final advance.
        let mut all = steps.clone();
        all.push(Duration::ZERO);
        let bound: u64 = model_per_phase(&policy, clock.now_ns(), &all, 1_000)
            .iter()
            .sum();
        let admitted = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, clock, admitted, steps) = (
                    store.clone(),
                    clock.clone(),
                    admitted.clone(),
                    steps.clone(),
                );
                std::thread::spawn(move || {
                    let mut steps = steps.into_iter();
                    for n in 0..PER_THREAD / 2 {
                        if thread == 0 && n % 12 == 11 {
                            if let Some(step) = steps.next() {
                                clock.advance(step);
                            }
                        }
                        let d = store.check_sync(Charge::new(b"hot", &policy, 1)).unwrap();
                        admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a checking thread panicked");
        }
        let got = admitted.load(Ordering::Relaxed);
        println!("{name}: free-running admitted {got}, model bound {bound}");
        assert!(got <= bound, "{name}: admitted {got} > {bound}");
        assert!(got >= LIMIT, "{name}: admitted only {got}");
    }
}

/// All-or-nothing under concurrency: 8 threads with costs 1-3 hit a tight
/// per-second rule and two loose long-period rules in one call, while time
/// moves in phases. The loose rules are charged exactly the cost of the
/// requests every rule admitted, never a unit for a request one rule denied.
#[test]
fn multi_rule_checks_charge_only_admitted_requests() {
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let store = manual_store(&clock);
    let tight = Policy::sliding_log(5, Duration::from_secs(1)).unwrap();
    let daily = Policy::fixed_window(100_000, Duration::from_secs(86_400)).unwrap();
    let hourly = Policy::cell(99_999, 1, Duration::from_secs(3600)).unwrap();
    let steps = schedule(50);
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (store, clock, barrier, steps) =
                (store.clone(), clock.clone(), barrier.clone(), steps.clone());
            std::thread::spawn(move || {
                let cost = 1 + thread as u64 % 3;
                let (mut requests, mut units) = (0u64, 0u64);
                for step in steps {
                    barrier.wait();
                    for _ in 0..100 {
                        let rules = [
                            Charge::new(b"u:tight", &tight, cost),
                            Charge::new(b"u:daily", &daily, cost),
                            Charge::new(b"u:hourly", &hourly, cost),
                        ];
                        let d = store.check_all_sync(&rules).unwrap();
                        if d.iter().all(|d| d.allowed) {
                            requests += 1;
                            units += cost;
                        } else {
                            assert!(!d[0].allowed, "only the tight rule can deny");
                        }
                    }
                    barrier.wait();
                    if thread == 0 {
                        clock.advance(step);
                    }
                }
                (requests, units)
            })
        })
        .collect();
    let (mut requests, mut units) = (0, 0);
    for h in handles {
        let (r, u) = h.join().expect("a checking thread panicked");
        requests += r;
        units += u;
    }
    let peek = |key: &[u8], p: &Policy| store.check_sync(Charge::new(key, p, 0)).unwrap();
    println!("multi-rule: {requests} requests admitted, {units} units");
    assert!(requests > 0);
    assert_eq!(100_000 - peek(b"u:daily", &daily).remaining, units);
    assert_eq!(100_000 - peek(b"u:hourly", &hourly).remaining, units);
    // The tight rule: never more than 5 units in any second. Units charged at
    // one instant are all of one phase; the model replays that bound.
    assert!(
        units <= 5 * (1 + steps.iter().map(|s| s.as_secs() + 1).sum::<u64>()),
        "{units}"
    );
}
