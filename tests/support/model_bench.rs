//! The model bench of the Redis property tests: one server, a Redis store
//! on a manual client clock and a fresh memory store per case, run through
//! the same ops and compared decision by decision.
#![allow(dead_code, unused_macros)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use tower_throttle::clock::ManualClock;
use tower_throttle::decision::PermitId;
use tower_throttle::decision::Receipt;
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Decision, MemoryStore, Policy, Store};

use crate::redis_support::{current_thread_runtime as runtime, RedisServer};

#[derive(Clone, Debug)]
pub enum Op {
    Advance(u64),
    Check(u64),
    /// Refunds `n` units of the receipt at this index (mod the receipts held).
    Refund(usize, u64),
    Reset,
    Release(usize),
}

/// Ops on `policy`; the clock only moves forward. (A clock going back
/// after a key was deleted or pruned can revive state the memory store still
/// holds: a difference of both units, not of this one's arithmetic.)
pub fn with_ops(policy: Policy, span_us: u64) -> impl Strategy<Value = (Policy, Vec<Op>)> {
    let limit = policy.limit();
    let span = span_us.max(1);
    let op = prop_oneof![
        2 => (0..=span / 8).prop_map(Op::Advance),
        2 => (0..=span * 2).prop_map(Op::Advance),
        1 => (0..=3u64).prop_map(Op::Advance),
        8 => (0..=limit + 1).prop_map(Op::Check),
        1 => (any::<usize>(), 1..=limit + 1).prop_map(|(i, n)| Op::Refund(i, n)),
        1 => Just(Op::Reset),
        2 => any::<usize>().prop_map(Op::Release),
    ];
    (Just(policy), proptest::collection::vec(op, 1..=30))
}

/// One Redis server, store and clock for all cases of a property.
pub struct Bench {
    pub _server: RedisServer,
    pub rt: tokio::runtime::Runtime,
    pub clock: ManualClock,
    pub redis: RedisStore,
    pub case: AtomicU64,
}

impl Bench {
    pub fn new() -> Bench {
        let server = RedisServer::start();
        let rt = runtime();
        let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
        let redis = rt.block_on(async {
            RedisStore::builder()
                .prefix("t")
                .timeout(Duration::from_secs(5))
                .time_source(TimeSource::client(clock.clone()))
                // Real time passing never expires what the frozen clock holds.
                .ttl_padding(Duration::from_secs(600))
                .connect(server.url().as_str())
                .await
                .unwrap()
        });
        Bench {
            _server: server,
            rt,
            clock,
            redis,
            case: AtomicU64::new(0),
        }
    }

    pub fn run(&self, policy: Policy, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let key = format!("case-{}", self.case.fetch_add(1, Ordering::Relaxed));
        let key = key.as_bytes();
        let mem = MemoryStore::builder()
            .clock(self.clock.clone())
            .sweep_interval(None)
            .build();
        let (redis, clock) = (&self.redis, &self.clock);
        let strip = strip_permit;
        self.rt.block_on(async {
            let mut permits: Vec<(PermitId, PermitId)> = Vec::new();
            let mut receipts: Vec<(Receipt, Receipt)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Advance(n) => clock.advance(Duration::from_micros(n)),
                    Op::Check(cost) => {
                        let m = mem.check(Charge::new(key, &policy, cost)).await.unwrap();
                        let r = redis.check(Charge::new(key, &policy, cost)).await.unwrap();
                        prop_assert_eq!(strip(m), strip(r), "step {} cost {}", step, cost);
                        if let (Some(a), Some(b)) = (m.permit, r.permit) {
                            permits.push((a, b));
                        }
                        if let (Some(a), Some(b)) = (m.receipt(), r.receipt()) {
                            receipts.push((a, b));
                        }
                    }
                    Op::Refund(i, n) if !receipts.is_empty() => {
                        let (a, b) = receipts.swap_remove(i % receipts.len());
                        mem.refund(key, &policy, &a.part(n)).await.unwrap();
                        redis.refund(key, &policy, &b.part(n)).await.unwrap();
                    }
                    Op::Refund(..) => {}
                    Op::Reset => {
                        mem.reset(key, &policy).await.unwrap();
                        redis.reset(key, &policy).await.unwrap();
                        permits.clear();
                    }
                    Op::Release(i) if !permits.is_empty() => {
                        let (a, b) = permits.remove(i % permits.len());
                        mem.release(key, &policy, a).await.unwrap();
                        redis.release(key, &policy, b).await.unwrap();
                    }
                    Op::Release(_) => {}
                }
            }
            Ok(())
        })
    }
}

/// `d` with its permit id (the store's own numbering) zeroed, for
/// comparing two stores' decisions.
pub fn strip_permit(d: Decision) -> Decision {
    let zero = |p: Option<PermitId>| p.map(|_| PermitId(0));
    Decision {
        permit: zero(d.permit),
        ..d
    }
}

macro_rules! model_test {
    ($name:ident, $strategy:expr) => {
        #[test]
        fn $name() {
            let bench = Bench::new();
            let config = ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            };
            proptest!(config, |((policy, ops) in $strategy)| {
                bench.run(policy, ops)?;
            });
        }
    };
}

macro_rules! long_model_test {
    ($name:ident, $strategy:expr) => {
        #[test]
        fn $name() {
            let bench = Bench::new();
            let config = ProptestConfig {
                cases: 64,
                failure_persistence: None,
                ..ProptestConfig::default()
            };
            proptest!(config, |((policy, ops) in $strategy)| {
                bench.clock.set_ns(1_700_000_000_000_000_000);
                bench.run(policy, ops)?;
            });
        }
    };
}
