//! N simulated processes — N leasing stores, each with its own leases, over
//! ONE shared memory store, all on one manual clock — run a random schedule
//! of unit checks (and, for windows, refunds and flushes). Whatever the
//! schedule, the admissions they report together are ones the algorithm
//! allows: at most `max` per fixed window, and a sequence the pure
//! `algorithm::gcra` / `algorithm::sliding_window` functions admit in full
//! when replayed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tower_throttle::algorithm::{gcra, sliding_window};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::policy::Algorithm;
use tower_throttle::store::lease::LeasingStore;
use tower_throttle::store::{Charge, MemoryStore, Store};
use tower_throttle::{Decision, Policy};

use crate::counting_store::CountingStore;

const S: u64 = 1_000_000_000;
const KEY: &[u8] = b"global";
/// A time step that lands on the next multiple of the run's grid.
const TO_GRID: u64 = u64::MAX;

type Shared = Arc<CountingStore<MemoryStore<ManualClock>>>;

/// How the processes lease: hot threshold, initial block, max block,
/// blocks per period, prefetching.
#[derive(Clone, Copy, Debug)]
struct Tuning(u64, u64, u64, u64, bool);

/// One step: a process, the time that passes before it, what it does.
#[derive(Clone, Copy, Debug)]
enum Op {
    Check,
    /// Refund the process's latest admission (windows only).
    Refund,
    Flush,
}

fn tuning() -> impl Strategy<Value = Tuning> {
    (1..6u64, 1..16u64, 0..32u64, 1..4u64, any::<bool>())
        .prop_map(|(h, i, extra, b, prefetch)| Tuning(h, i, i + extra, b, prefetch))
}

fn schedule(window: u64, refunds: bool) -> impl Strategy<Value = Vec<(usize, u64, Op)>> {
    let dt = prop_oneof![
        4 => Just(0u64),
        // To the next instant on the grid (window start, GCRA slot) or
        // the one before it: where a unit spent one ns late would show.
        1 => Just(TO_GRID),
        1 => Just(TO_GRID - 1),
        4 => 0..window / 50,
        2 => 0..window / 3,
        1 => 0..2 * window,
    ];
    let op = if refunds {
        prop_oneof![12 => Just(Op::Check), 2 => Just(Op::Refund), 1 => Just(Op::Flush)].boxed()
    } else {
        prop_oneof![12 => Just(Op::Check), 1 => Just(Op::Flush)].boxed()
    };
    prop::collection::vec((0..4usize, dt, op), 1..600)
}

struct Run {
    /// Admission instants still counted (refunded ones removed), in order.
    admitted: Vec<u64>,
    /// Checks answered, and calls that reached the shared store.
    checks: usize,
    calls: usize,
}

/// Four leasing stores (processes) over `shared`, on `clock`.
fn processes(
    shared: &Shared,
    clock: &ManualClock,
    t: Tuning,
    margin: Duration,
) -> Vec<LeasingStore<Shared>> {
    (0..4)
        .map(|_| {
            LeasingStore::builder(shared.clone())
                .clock(clock.clone())
                .hot_threshold(t.0)
                .initial_block(t.1)
                .max_block(t.2)
                .blocks_per_period(t.3)
                .prefetch(t.4)
                .expiry_margin(margin)
                .build()
                .unwrap()
        })
        .collect()
}

/// Runs `ops` on four leasing stores over one shared store; time steps of
/// [`TO_GRID`] (or one less) go to the next multiple of `grid` (or the ns
/// before it).
fn run(policy: &Policy, grid: u64, t: Tuning, ops: &[(usize, u64, Op)]) -> Run {
    let clock = ManualClock::starting_at(3_600 * S + 123_456_789);
    let shared: Shared = Arc::new(CountingStore::new(
        MemoryStore::builder().clock(clock.clone()).build(),
    ));
    // Exact, or a µs early (the first unit is the charge's own).
    let margin = Duration::from_nanos(t.1 % 2 * 1_000);
    let processes = processes(&shared, &clock, t, margin);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut admitted: Vec<(u64, bool)> = Vec::new();
    let mut latest: HashMap<usize, (usize, Decision)> = HashMap::new();
    let mut checks = 0;
    rt.block_on(async {
        for &(i, dt, op) in ops {
            let now = clock.now_ns();
            let dt = match dt {
                TO_GRID => grid - now % grid,
                d if d == TO_GRID - 1 => (grid - now % grid).saturating_sub(1),
                d => d,
            };
            clock.advance(Duration::from_nanos(dt));
            if dt % 2 == 1 {
                // Lets blocks asked for in the background land now; the
                // others land when a check waits for them.
                tokio::task::yield_now().await;
            }
            let store = &processes[i];
            match op {
                Op::Check => {
                    checks += 1;
                    let d = store.check(Charge::new(KEY, policy, 1)).await.unwrap();
                    if d.allowed {
                        latest.insert(i, (admitted.len(), d));
                        admitted.push((clock.now_ns(), true));
                    }
                }
                Op::Refund => {
                    if let Some((at, d)) = latest.remove(&i) {
                        let receipt = d.receipt().unwrap();
                        store.refund(KEY, policy, &receipt).await.unwrap();
                        admitted[at].1 = false;
                    }
                }
                Op::Flush => {
                    store.flush().await.unwrap();
                }
            }
        }
    });
    Run {
        admitted: admitted.into_iter().filter(|a| a.1).map(|a| a.0).collect(),
        checks,
        calls: shared.checks(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fixed_windows_never_admit_more_than_max(
        max in 1..40u64,
        t in tuning(),
        ops in schedule(S, true),
    ) {
        let policy = Policy::fixed_window(max, Duration::from_secs(1)).unwrap();
        let run = run(&policy, S, t, &ops);
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for u in &run.admitted {
            *per_window.entry(u / S).or_default() += 1;
        }
        for (w, n) in per_window {
            prop_assert!(n <= max, "window {w}: {n} admitted, max {max}");
        }
        prop_assert!(run.calls <= run.checks + ops.len());
    }

    #[test]
    fn gcra_admissions_conform(
        limit in 1..40u64,
        t in tuning(),
        ops in schedule(S, false),
    ) {
        // T = 1 s / limit, τ = 1 s.
        let policy = Policy::cell(limit - 1, limit, Duration::from_secs(1)).unwrap();
        let Algorithm::Gcra(g) = *policy.algorithm() else { unreachable!() };
        let run = run(&policy, g.emission_interval_ns, t, &ops);
        let mut tat = 0;
        for (n, &u) in run.admitted.iter().enumerate() {
            prop_assert!(
                gcra::check(&g, tat, u, 1).allowed,
                "admission {n} at {u} does not conform (tat {tat})"
            );
            tat = gcra::admit(&g, tat, u, 1);
        }
    }

    #[test]
    fn sliding_window_admissions_replay(
        max in 1..40u64,
        t in tuning(),
        ops in schedule(S, true),
    ) {
        let policy = Policy::sliding_window(max, Duration::from_secs(1)).unwrap();
        let Algorithm::SlidingWindow(p) = *policy.algorithm() else { unreachable!() };
        let run = run(&policy, S, t, &ops);
        let mut state = Default::default();
        for (n, &u) in run.admitted.iter().enumerate() {
            prop_assert!(
                sliding_window::check(&p, &state, u, 1).allowed,
                "admission {n} at {u} is over the estimate ({state:?})"
            );
            state = sliding_window::admit(&p, &state, u, 1);
        }
    }
}

/// The schedules above could pass by never leasing: on a steady hot key
/// under its limit the leasing processes reach the shared store for a
/// small share of their checks, and deny few (a denial while the shared
/// count had room: units held by other processes).
#[test]
fn hot_keys_are_served_mostly_in_process() {
    let policy = Policy::fixed_window(1_000, Duration::from_secs(1)).unwrap();
    for prefetch in [false, true] {
        let tuning = Tuning(16, 8, 256, 4, prefetch);
        // 4 processes, 900 checks a second between them, for 10 s.
        let ops: Vec<(usize, u64, Op)> = (0..9_000).map(|n| (n % 4, S / 900, Op::Check)).collect();
        let run = run(&policy, S, tuning, &ops);
        let denied = run.checks - run.admitted.len();
        eprintln!(
            "prefetch {prefetch}: {} store calls, {denied} denied, for {} checks",
            run.calls, run.checks
        );
        assert!(run.calls * 10 < run.checks, "{} store calls", run.calls);
        assert!(denied * 20 < run.checks, "{denied} denied");
        let mut per_window: HashMap<u64, u64> = HashMap::new();
        for u in &run.admitted {
            *per_window.entry(u / S).or_default() += 1;
        }
        assert!(per_window.values().all(|&n| n <= 1_000));
    }
}

/// GCRA with one process spending at about the key's rate: leased units
/// are spent within their slots, so leasing saves calls there too.
#[test]
fn gcra_leases_pay_at_the_key_s_rate() {
    // T = 1 ms.
    let policy = Policy::cell(99, 1_000, Duration::from_secs(1)).unwrap();
    let ops: Vec<(usize, u64, Op)> = (0..5_000).map(|_| (0, S / 1_000, Op::Check)).collect();
    for prefetch in [false, true] {
        let run = run(&policy, S, Tuning(16, 8, 64, 1, prefetch), &ops);
        assert!(
            run.admitted.len() >= 4_900,
            "prefetch {prefetch}: admitted {}",
            run.admitted.len()
        );
        assert!(run.calls * 5 < run.checks, "{} calls", run.calls);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// All or nothing across processes: a hot global rule (leased) and a
    /// per-user rule in one check. Admissions stay within both limits per
    /// window, and once every process has flushed, the shared counts of the
    /// current window are exactly the admissions in it: a check another
    /// rule denied charged nothing anywhere.
    #[test]
    fn multi_rule_checks_are_all_or_nothing_and_exact(
        global_max in 1..60u64,
        user_max in 1..8u64,
        t in tuning(),
        ops in prop::collection::vec((0..4usize, 0..3usize, 0..S / 20), 1..300),
    ) {
        let clock = ManualClock::starting_at(3_600 * S);
        let shared: Shared = Arc::new(CountingStore::new(
            MemoryStore::builder().clock(clock.clone()).build(),
        ));
        let processes = processes(&shared, &clock, t, Duration::ZERO);
        let global = Policy::fixed_window(global_max, Duration::from_secs(1)).unwrap();
        let user = Policy::fixed_window(user_max, Duration::from_secs(1)).unwrap();
        let users: Vec<Vec<u8>> = (0..3).map(|u| format!("user-{u}").into_bytes()).collect();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // (window, user) → admissions.
        let mut admitted: HashMap<(u64, Option<usize>), u64> = HashMap::new();
        rt.block_on(async {
            for &(i, u, dt) in &ops {
                clock.advance(Duration::from_nanos(dt));
                if dt % 2 == 1 {
                    tokio::task::yield_now().await;
                }
                let rules = [Charge::new(KEY, &global, 1), Charge::new(&users[u], &user, 1)];
                let ds = processes[i].check_all(&rules).await.unwrap();
                prop_assert_eq!(ds.len(), 2);
                let charged: Vec<u64> = ds.iter().map(|d| d.charged).collect();
                let window = clock.now_ns() / S;
                if ds.iter().all(|d| d.allowed) {
                    prop_assert_eq!(charged, vec![1, 1]);
                    *admitted.entry((window, None)).or_default() += 1;
                    *admitted.entry((window, Some(u))).or_default() += 1;
                } else {
                    prop_assert_eq!(charged, vec![0, 0]);
                }
            }
            // Blocks still on their way land (kept as next leases), then
            // every lease goes back.
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            for p in &processes {
                p.flush().await.unwrap();
            }
            let window = clock.now_ns() / S;
            let g = shared.inner.check(Charge::new(KEY, &global, 0)).await.unwrap().remaining;
            let n = admitted.get(&(window, None)).copied().unwrap_or(0);
            prop_assert_eq!(g, global_max - n, "global, current window");
            for (u, key) in users.iter().enumerate() {
                let r = shared.inner.check(Charge::new(key, &user, 0)).await.unwrap().remaining;
                let n = admitted.get(&(window, Some(u))).copied().unwrap_or(0);
                prop_assert_eq!(r, user_max - n, "user {}", u);
            }
            Ok(())
        })?;
        for ((w, u), n) in admitted {
            let max = if u.is_some() { user_max } else { global_max };
            prop_assert!(n <= max, "window {w} {u:?}: {n} > {max}");
        }
    }
}
