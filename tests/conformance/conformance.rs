//! Every store of the crate through the one conformance suite, the public
//! `tower_throttle::store::conformance` (feature `conformance`): the way to
//! validate a new backend.
//!
//! Redis stores run on a client clock (`TimeSource::client`) so that time
//! is the test's; `CellStore` runs when `REDIS_CELL_MODULE` names a built
//! redis-cell module (it is not packaged for Debian), and says so otherwise.

#[cfg(feature = "redis")]
use crate::faults;

#[cfg(any(feature = "redis", feature = "governor"))]
use std::time::Duration;

use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::conformance::{run, Caps, Subject};
use tower_throttle::MemoryStore;

const START_NS: u64 = 1_700_000_000_000_000_000;

fn manual_subject<S>(name: &'static str, store: S, clock: &ManualClock, caps: Caps) -> Subject<S> {
    let (a, n) = (clock.clone(), clock.clone());
    Subject {
        name,
        store,
        advance: Box::new(move |d| a.advance(d)),
        now_ns: Box::new(move || n.now_ns()),
        caps,
        key_prefix: format!("conf-{}", std::process::id()),
    }
}

#[tokio::test]
async fn memory_store() {
    let clock = ManualClock::starting_at(START_NS);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    run(&manual_subject("MemoryStore", store, &clock, Caps::FULL)).await;
}

/// A store that writes only what `Store` requires (`decide`, `refund`,
/// `reset`), over the memory store's, answering every check later (as a
/// remote store does): the trait's defaults for `check`, `check_all` and
/// `release` must pass the whole suite.
struct ThreeMethodStore(MemoryStore<ManualClock>);

impl tower_throttle::Store for ThreeMethodStore {
    // Always later, as a remote store's answers come.
    fn decide<'a>(
        &'a self,
        charges: &'a [tower_throttle::store::Charge<'a>],
    ) -> tower_throttle::store::Answer<
        impl std::future::Future<
                Output = Result<
                    tower_throttle::store::Decisions,
                    tower_throttle::store::StoreError,
                >,
            > + Send
            + 'a,
    > {
        tower_throttle::store::Answer::Later(async move { self.0.decide(charges).await })
    }

    async fn refund(
        &self,
        key: &[u8],
        policy: &tower_throttle::Policy,
        receipt: &tower_throttle::decision::Receipt,
    ) -> Result<(), tower_throttle::StoreError> {
        self.0.refund(key, policy, receipt).await
    }

    async fn reset(
        &self,
        key: &[u8],
        policy: &tower_throttle::Policy,
    ) -> Result<(), tower_throttle::StoreError> {
        self.0.reset(key, policy).await
    }
}

#[tokio::test]
async fn a_store_of_three_methods_passes_on_the_defaults() {
    let clock = ManualClock::starting_at(START_NS);
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .sweep_interval(None)
        .build();
    let subject = manual_subject(
        "ThreeMethodStore",
        ThreeMethodStore(store),
        &clock,
        Caps::FULL,
    );
    run(&subject).await;
}

#[cfg(feature = "governor")]
#[tokio::test]
async fn governor_store() {
    use governor::clock::FakeRelativeClock;
    use tower_throttle::store::GovernorStore;

    let fake = FakeRelativeClock::default();
    let elapsed = ManualClock::starting_at(START_NS);
    let (f, e) = (fake.clone(), elapsed.clone());
    let subject = Subject {
        name: "GovernorStore",
        store: GovernorStore::with_clock(fake),
        advance: Box::new(move |d| {
            f.advance(d);
            e.advance(d);
        }),
        now_ns: Box::new(move || elapsed.now_ns()),
        // GCRA only; no peek, refund, reset or multi-rule checks; its
        // reset_after is an upper bound (documented on GovernorStore).
        caps: Caps {
            all_algorithms: false,
            cell_only: false,
            peek: false,
            refund: false,
            reset: false,
            multi_rule: false,
            exact_reset: false,
            resolution: Duration::from_nanos(1),
        },
        key_prefix: "conf".into(),
    };
    run(&subject).await;
}

#[cfg(feature = "redis")]
mod redis_stores {
    use super::*;
    use crate::redis_support::{runtime, RedisCluster, RedisServer};
    use tower_throttle::store::redis::{HashTag, RedisStore, RedisStoreBuilder, TimeSource};
    use tower_throttle::store::CellStore;

    /// Redis decides on the client clock in whole microseconds; TTLs are
    /// padded so real time passing never expires what the test clock holds.
    fn builder(clock: &ManualClock) -> RedisStoreBuilder {
        RedisStore::builder()
            .prefix("conformance")
            .timeout(Duration::from_secs(5))
            .time_source(TimeSource::client(clock.clone()))
            .ttl_padding(Duration::from_secs(600))
    }

    const REDIS: Caps = Caps {
        resolution: Duration::from_micros(1),
        ..Caps::FULL
    };

    #[test]
    fn redis_store() {
        let server = RedisServer::start();
        runtime().block_on(async {
            for batching in [true, false] {
                let clock = ManualClock::starting_at(START_NS);
                let store = builder(&clock)
                    .batching(batching)
                    .connect(server.url())
                    .await
                    .unwrap();
                let mut subject = manual_subject("RedisStore", store, &clock, REDIS);
                subject.key_prefix = format!("batching-{batching}");
                run(&subject).await;
            }
        });
    }

    #[test]
    fn redis_cluster_store() {
        let cluster = RedisCluster::start();
        runtime().block_on(async {
            let clock = ManualClock::starting_at(START_NS);
            // One slot for all keys, so multi-rule checks combine any keys.
            let store = builder(&clock)
                .hash_tag(HashTag::Fixed("conformance".into()))
                .connect_cluster(cluster.urls())
                .await
                .unwrap();
            run(&manual_subject("RedisClusterStore", store, &clock, REDIS)).await;
        });
    }

    #[test]
    fn cell_store() {
        let Ok(module) = std::env::var("REDIS_CELL_MODULE") else {
            eprintln!(
                "cell_store: skipped (set REDIS_CELL_MODULE=/path/to/libredis_cell.so to run \
                 CellStore through the suite; redis-cell is not packaged for Debian)"
            );
            return;
        };
        let server = RedisServer::start_with_args(&["--loadmodule".into(), module]);
        runtime().block_on(async {
            let store = CellStore::builder()
                .timeout(Duration::from_millis(150))
                .connect(server.url())
                .await
                .unwrap();
            // redis-cell runs on the server's own clock in whole seconds:
            // the walk cannot drive it, so it runs the untimed parts only.
            let clock = ManualClock::starting_at(START_NS);
            let subject = Subject {
                name: "CellStore",
                store,
                advance: Box::new(|_| {}),
                now_ns: Box::new(move || clock.now_ns()),
                caps: Caps {
                    all_algorithms: false,
                    cell_only: true,
                    peek: true,
                    refund: false,
                    reset: true,
                    multi_rule: false,
                    exact_reset: false,
                    resolution: Duration::from_secs(1),
                },
                key_prefix: format!("cell-{}", std::process::id()),
            };
            tower_throttle::store::conformance::untimed(&subject).await;
            no_offline_queue(&server, &subject.store).await;
            waiting_checks_again(subject.store.clone()).await;
        });
    }

    /// `CL.THROTTLE` takes no widened tolerance: `Limiter::wait` on
    /// CellStore checks again after the denial's wait (it was a `StoreError`
    /// on every delayed call) and is admitted when the quota returns.
    async fn waiting_checks_again(store: CellStore) {
        use std::time::Instant;
        use tower_throttle::{Limiter, Policy, Store};
        assert!(!store.reserves_slots());
        let second = Policy::cell(0, 1, Duration::from_secs(1)).unwrap();
        let limiter = Limiter::try_new(store, second).unwrap();
        let key = format!("wait-{}", std::process::id());
        assert!(limiter.check(&key).await.unwrap().allowed);
        let started = Instant::now();
        let d = limiter.wait(&key, Duration::from_secs(3)).await.unwrap();
        assert!(d.allowed, "{d:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
    }

    /// CellStore's breaker: calls made while the server is frozen fail and
    /// are not buffered to run when it wakes (at most the call that tripped
    /// the breaker and the probes reach it late), and the store answers
    /// again within a second of the server.
    async fn no_offline_queue(server: &RedisServer, store: &CellStore) {
        use std::time::Instant;
        use tower_throttle::store::Charge;
        use tower_throttle::{Policy, Store};
        let policy = Policy::cell(1_000, 1_000, Duration::from_secs(1)).unwrap();
        let cells = |s: &RedisServer| {
            let calls = tokio::task::block_in_place(|| faults::command_calls(s));
            calls.get("cl.throttle").copied().unwrap_or(0)
        };
        let before = cells(server);
        let paused = tokio::task::block_in_place(|| faults::Paused::pause(server));
        let mut failed = 0;
        for i in 0..30u32 {
            let key = format!("frozen-{i}");
            if store
                .check(Charge::new(key.as_bytes(), &policy, 1))
                .await
                .is_err()
            {
                failed += 1;
            }
        }
        assert_eq!(failed, 30, "every call fails while the server is frozen");
        paused.resume();
        let woke = Instant::now();
        loop {
            if store.check(Charge::new(b"awake", &policy, 1)).await.is_ok() {
                break;
            }
            assert!(
                woke.elapsed() < Duration::from_secs(1),
                "the store stays failed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let late = cells(server) - before - 1; // less the awake check
        assert!(
            late <= 1,
            "{late} CL.THROTTLE calls made while frozen ran after the server woke"
        );
    }
}
