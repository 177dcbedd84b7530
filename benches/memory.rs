//! MemoryStore beside governor's keyed limiter (DashMap state), same work in
//! the same group. `cargo bench --bench memory`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tower_throttle::store::Charge;
use tower_throttle::{MemoryStore, Policy};

/// Generous enough that every check in the benchmark is admitted.
fn policy() -> Policy {
    Policy::cell(999_999, 1_000_000_000, Duration::from_secs(1)).unwrap()
}

fn governor() -> DefaultKeyedRateLimiter<Vec<u8>> {
    let quota = Quota::with_period(Duration::from_nanos(1))
        .unwrap()
        .allow_burst(NonZeroU32::new(1_000_000).unwrap());
    RateLimiter::keyed(quota)
}

fn store() -> MemoryStore {
    MemoryStore::builder().max_keys(8_000_000).build()
}

fn keys(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("user:{i:08}:reply").into_bytes())
        .collect()
}

/// A cheap deterministic permutation, so both sides visit keys in one order.
fn scatter(i: u64, n: u64) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n) as usize
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    g.throughput(Throughput::Elements(1));
    let (ours, gov, p) = (store(), governor(), policy());
    let key = b"user:00000001:reply".to_vec();
    g.bench_function("tower_throttle", |b| {
        b.iter(|| black_box(ours.check_sync(Charge::new(&key, &p, 1)).unwrap().allowed))
    });
    g.bench_function("governor", |b| {
        b.iter(|| black_box(gov.check_key(&key).is_ok()))
    });
    for (name, window) in [
        (
            "sliding_window",
            Policy::sliding_window(u64::MAX / 4, Duration::from_secs(1)),
        ),
        (
            "fixed_window",
            Policy::fixed_window(u64::MAX / 4, Duration::from_secs(1)),
        ),
        (
            "sliding_log",
            Policy::sliding_log(u64::MAX / 4, Duration::from_millis(1)),
        ),
    ] {
        let window = window.unwrap();
        g.bench_function(format!("tower_throttle_{name}"), |b| {
            b.iter(|| {
                black_box(
                    ours.check_sync(Charge::new(&key, &window, 1))
                        .unwrap()
                        .allowed,
                )
            })
        });
    }
    g.finish();
}

fn many_keys(c: &mut Criterion, group: &str, n: usize, random: bool) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    let (ours, gov, p) = (store(), governor(), policy());
    let keys = keys(n);
    for k in &keys {
        ours.check_sync(Charge::new(k, &p, 1)).unwrap();
        let _ = gov.check_key(k);
    }
    let pick = |i: u64| {
        if random {
            scatter(i, n as u64)
        } else {
            (i % n as u64) as usize
        }
    };
    let mut i = 0u64;
    g.bench_function("tower_throttle", |b| {
        b.iter(|| {
            i += 1;
            black_box(
                ours.check_sync(Charge::new(&keys[pick(i)], &p, 1))
                    .unwrap()
                    .allowed,
            )
        })
    });
    let mut i = 0u64;
    g.bench_function("governor", |b| {
        b.iter(|| {
            i += 1;
            black_box(gov.check_key(&keys[pick(i)]).is_ok())
        })
    });
    g.finish();
}

fn round_robin_10k(c: &mut Criterion) {
    many_keys(c, "round_robin_10k_keys", 10_000, false);
}

fn random_1m(c: &mut Criterion) {
    many_keys(c, "random_1m_resident_keys", 1_000_000, true);
}

fn new_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("new_key_insert");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    let p = policy();
    // Fresh limiters per batch keep the maps at comparable sizes for both.
    g.bench_function("tower_throttle", |b| {
        let mut n = 0u64;
        b.iter_batched(
            || (store(), keys(10_000)),
            |(ours, keys)| {
                for k in &keys {
                    n += u64::from(ours.check_sync(Charge::new(k, &p, 1)).unwrap().allowed);
                }
                black_box(n);
                ours
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("governor", |b| {
        let mut n = 0u64;
        b.iter_batched(
            || (governor(), keys(10_000)),
            |(gov, keys)| {
                for k in keys {
                    n += u64::from(gov.check_key(&k).is_ok());
                }
                black_box(n);
                gov
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Two threads on one hot key; time per check per thread.
fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("two_threads_hot_key");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    fn run<F: Fn() + Send + Sync + 'static>(iters: u64, f: Arc<F>) -> Duration {
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (f, barrier) = (f.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        f();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    }
    let (ours, gov, p) = (store(), Arc::new(governor()), policy());
    let key: &'static [u8] = b"user:00000001:reply";
    let ours_f = Arc::new(move || {
        black_box(ours.check_sync(Charge::new(key, &p, 1)).unwrap());
    });
    g.bench_function("tower_throttle", |b| {
        b.iter_custom(|iters| run(iters, ours_f.clone()))
    });
    let key = key.to_vec();
    let gov_f = Arc::new(move || {
        let _ = black_box(gov.check_key(&key));
    });
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| run(iters, gov_f.clone()))
    });
    g.finish();
}

/// What tracking the hottest keys costs a check: off, sampled (the
/// default, one in 16) and every check, on one hot key and on 10,000 keys.
fn hottest_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("hottest_keys");
    g.throughput(Throughput::Elements(1));
    let p = policy();
    let tracked = |every: u32| {
        MemoryStore::builder()
            .max_keys(8_000_000)
            .track_hottest_keys(64, Duration::from_secs(60))
            .sample_hottest_keys(every)
            .build()
    };
    let hot = b"user:00000001:reply".to_vec();
    let many = keys(10_000);
    for (name, store) in [
        ("off", store()),
        ("sampled_16", tracked(16)),
        ("every_check", tracked(1)),
    ] {
        g.bench_function(format!("hot_key_{name}"), |b| {
            b.iter(|| black_box(store.check_sync(Charge::new(&hot, &p, 1)).unwrap().allowed))
        });
        let mut i = 0u64;
        g.bench_function(format!("10k_keys_{name}"), |b| {
            b.iter(|| {
                i += 1;
                let key = &many[scatter(i, many.len() as u64)];
                black_box(store.check_sync(Charge::new(key, &p, 1)).unwrap().allowed)
            })
        });
    }
    g.finish();
}

/// Two rules in one all-or-nothing check (`check_all_sync`: both keys'
/// shard locks, the peeks, then the charges) beside the same two keys
/// checked one by one (no atomicity): what a multi-rule layer or
/// `Limiter::and` pays for all-or-nothing, on one hot pair and over 10,000.
fn two_rules(c: &mut Criterion) {
    let mut g = c.benchmark_group("two_rules");
    g.throughput(Throughput::Elements(1));
    let (ours, p) = (store(), policy());
    let window = Policy::fixed_window(u64::MAX / 4, Duration::from_secs(1)).unwrap();
    let users = keys(10_000);
    let ips: Vec<Vec<u8>> = (0..10_000)
        .map(|i| format!("ip:10.0.{}.{}", i / 256, i % 256).into_bytes())
        .collect();
    g.bench_function("all_or_nothing_hot_pair", |b| {
        b.iter(|| {
            let both = [
                Charge::new(&users[1], &p, 1),
                Charge::new(&ips[1], &window, 1),
            ];
            black_box(ours.check_all_sync(&both).unwrap()[0].allowed)
        })
    });
    g.bench_function("one_by_one_hot_pair", |b| {
        b.iter(|| {
            let a = ours.check_sync(Charge::new(&users[1], &p, 1)).unwrap();
            let b = ours.check_sync(Charge::new(&ips[1], &window, 1)).unwrap();
            black_box(a.allowed && b.allowed)
        })
    });
    let mut i = 0u64;
    g.bench_function("all_or_nothing_10k", |b| {
        b.iter(|| {
            i += 1;
            let k = scatter(i, 10_000);
            let both = [
                Charge::new(&users[k], &p, 1),
                Charge::new(&ips[k], &window, 1),
            ];
            black_box(ours.check_all_sync(&both).unwrap()[0].allowed)
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    two_rules,
    hot_key,
    hottest_keys,
    round_robin_10k,
    random_1m,
    new_key,
    two_threads
);
criterion_main!(benches);
