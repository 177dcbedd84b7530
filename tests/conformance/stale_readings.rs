//! Checks that commit out of the order of their clock readings.
//!
//! A check reads the clock once, then decides under the key's lock: a caller
//! that read `t1` can commit after another caller read `t2 > t1` and
//! committed (it was preempted in between). Replaying that order on one
//! thread (the manual clock set back to an instant it showed before) makes
//! the interleaving deterministic. Whatever the order, a store must admit no
//! more than the reference model checking greedily at every instant in
//! increasing order: that is the bound `tests/conformance/exactness/` asserts with
//! real threads (`free_running_clock_never_admits_more_than_the_model`).

use crate::models;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use models::Model;
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

const LIMIT: u64 = 20;
const START: u64 = 1_700_000_000_000_000_000;

fn policies() -> Vec<(&'static str, Policy)> {
    let s = Duration::from_secs(1);
    vec![
        ("cell", Policy::cell(LIMIT - 1, LIMIT, s).unwrap()),
        ("funnel", Policy::funnel(LIMIT, 16.0).unwrap()),
        ("token_bucket", Policy::token_bucket(LIMIT, 40.0).unwrap()),
        ("sliding_log", Policy::sliding_log(LIMIT, s).unwrap()),
        ("fixed_window", Policy::fixed_window(LIMIT, s).unwrap()),
        ("sliding_window", Policy::sliding_window(LIMIT, s).unwrap()),
        (
            "concurrency",
            Policy::concurrency_with_lease(LIMIT, s).unwrap(),
        ),
    ]
}

fn store(clock: &ManualClock) -> MemoryStore<ManualClock> {
    MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build()
}

/// Checks one unit of `key` as read at `at`.
fn check_at(store: &MemoryStore<ManualClock>, clock: &ManualClock, p: &Policy, at: u64) -> bool {
    clock.set_ns(at);
    store.check_sync(Charge::new(b"k", p, 1)).unwrap().allowed
}

/// What the model admits checking greedily (up to 1,000 times) at each
/// instant, in increasing order.
fn greedy_bound(policy: &Policy, instants: &[u64]) -> u64 {
    let mut model = Model::default();
    let (mut permit, mut total) = (0, 0);
    for &t in instants {
        for _ in 0..1_000 {
            permit += 1;
            if !model.check(b"k", policy, t, 1, permit).allowed {
                break;
            }
            total += 1;
        }
    }
    total
}

/// The race behind a once-failing run of the threaded test, step by step: a
/// check at `t2` drops the leases that lapsed by then; checks that read `t1`
/// (before they lapsed) commit after it. Their permits must last as long as
/// one granted at `t2`, or they lapse early and free room the policy never had.
#[test]
fn a_stale_reading_never_shortens_a_lease() {
    let policy = Policy::concurrency_with_lease(LIMIT, Duration::from_secs(1)).unwrap();
    let (clock, ms) = (ManualClock::starting_at(START), 1_000_000);
    let store = store(&clock);
    let (t0, t1, t2) = (START, START + 900 * ms, START + 1_500 * ms);
    let mut admitted = 0;
    for t in [t0; LIMIT as usize] {
        admitted += u64::from(check_at(&store, &clock, &policy, t));
    }
    // The first lease lapses between t1 and t2; t2 prunes them all and takes one.
    assert!(check_at(&store, &clock, &policy, t2));
    admitted += 1;
    // Stale readings of t1 see the pruned key: 19 more fit (as they would at t2).
    for _ in 0..LIMIT {
        admitted += u64::from(check_at(&store, &clock, &policy, t1));
    }
    assert_eq!(admitted, 2 * LIMIT);
    // At t1 + lease the permits granted on the stale readings are still held:
    // nothing lapses before t2 + lease.
    let t3 = t1 + 1_000 * ms;
    let after = (0..LIMIT)
        .filter(|_| check_at(&store, &clock, &policy, t3))
        .count();
    assert_eq!(after, 0, "permits granted on stale readings lapsed early");
    let bound = greedy_bound(&policy, &[t0, t1, t2, t3]);
    assert!(admitted <= bound, "{admitted} > {bound}");
}

/// Every algorithm, on a fixed pseudo-random replay: the clock steps through
/// a schedule (µs to several windows) and each check reads the current
/// instant or, one time in four, one of the three before it.
#[test]
fn stale_readings_never_admit_more_than_the_model() {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for round in 0..20 {
        let mut instants = vec![START];
        for _ in 0..100 {
            let step = match next(6) {
                0 => 0,
                1 => 1 + next(1_000),
                2 => 10_000 + next(40_000),
                3 => 50_000 + next(200_000),
                4 => 900_000 + next(200_000),
                _ => 1_000_000 + next(2_500_000),
            };
            instants.push(instants.last().unwrap() + step * 1_000);
        }
        let reads: Vec<Vec<usize>> = (0..instants.len())
            .map(|c| {
                (0..next(60))
                    .map(|_| {
                        let lag = if next(4) == 0 { next(4) as usize } else { 0 };
                        c.saturating_sub(lag)
                    })
                    .collect()
            })
            .collect();
        for (name, policy) in policies() {
            let clock = ManualClock::starting_at(START);
            let store = store(&clock);
            let admitted = reads
                .iter()
                .flatten()
                .filter(|&&i| check_at(&store, &clock, &policy, instants[i]))
                .count() as u64;
            let bound = greedy_bound(&policy, &instants);
            assert!(
                admitted <= bound,
                "{name} (round {round}): admitted {admitted} > {bound}"
            );
            assert!(admitted >= LIMIT, "{name} (round {round}): only {admitted}");
        }
    }
}

/// A manual clock whose callers yield right after reading it, so that
/// another thread often checks (and the clock moves) before they commit.
#[derive(Clone)]
struct YieldingClock(ManualClock);

impl Clock for YieldingClock {
    fn now_ns(&self) -> u64 {
        let now = self.0.now_ns();
        std::thread::yield_now();
        now
    }
}

/// The threaded form of the replay: 8 threads check one key while thread 0
/// moves the clock every 12 checks, every reading overtaken as often as the
/// scheduler allows. Bounded by the model at every instant of the schedule.
#[test]
fn threads_with_overtaken_readings_never_admit_more_than_the_model() {
    const THREADS: usize = 8;
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let steps: Vec<u64> = (0..150)
        .map(|_| match next(4) {
            0 => 10_000 + next(400_000),
            1 => 900_000 + next(200_000),
            _ => 1_000_000 + next(1_500_000),
        } * 1_000)
        .collect();
    let mut instants = vec![START];
    for s in &steps {
        instants.push(instants.last().unwrap() + s);
    }
    for (name, policy) in policies() {
        let manual = ManualClock::starting_at(START);
        let store = MemoryStore::builder()
            .clock(YieldingClock(manual.clone()))
            .sweep_interval(None)
            .build();
        let admitted = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let (store, manual, admitted, steps) = (
                    store.clone(),
                    manual.clone(),
                    admitted.clone(),
                    steps.clone(),
                );
                std::thread::spawn(move || {
                    let mut steps = steps.into_iter();
                    for n in 0..2_000 {
                        if thread == 0 && n % 12 == 11 {
                            if let Some(step) = steps.next() {
                                manual.advance(Duration::from_nanos(step));
                            }
                        }
                        let d = store.check_sync(Charge::new(b"k", &policy, 1)).unwrap();
                        admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a checking thread panicked");
        }
        let (got, bound) = (
            admitted.load(Ordering::Relaxed),
            greedy_bound(&policy, &instants),
        );
        println!("{name}: admitted {got}, model bound {bound}");
        assert!(got <= bound, "{name}: admitted {got} > {bound}");
    }
}
