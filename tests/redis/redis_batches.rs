//! How the Redis store sends and writes checks: a crowd split over batches
//! on the wire is admitted exactly to the limit, and GCRA state is written
//! with an `INCRBY` of the change and a `PEXPIRE` only when the expiry must
//! move. The expiry tests hold the store to the invariant that
//! makes skipping the `PEXPIRE` safe: a key never expires before its
//! theoretical arrival time, and at most a second after it.

use crate::redis_support;

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use redis_support::{current_thread_runtime as runtime, RedisServer};
use tower_throttle::clock::{Clock, ManualClock};
use tower_throttle::store::redis::{RedisStore, TimeSource};
use tower_throttle::store::Charge;
use tower_throttle::{Decision, Policy, Store};

/// A store on `clock` with no TTL padding: the TTLs are the real ones.
async fn store_on(server: &RedisServer, clock: &ManualClock) -> RedisStore {
    RedisStore::builder()
        .prefix("x")
        .timeout(Duration::from_secs(5))
        .time_source(TimeSource::client(clock.clone()))
        .connect(server.url())
        .await
        .unwrap()
}

#[test]
fn a_crowd_split_over_batches_is_admitted_exactly_to_the_limit() {
    let server = RedisServer::start();
    // A multi-thread runtime: the batches' tasks run on either worker, in
    // either order.
    let rt = redis_support::runtime();
    rt.block_on(async {
        let store = RedisStore::builder()
            .prefix("o")
            .connect(server.url())
            .await
            .unwrap();
        // 10 at once, then one an hour.
        let policy = Policy::cell(9, 1, Duration::from_secs(3600)).unwrap();
        for round in 0..30 {
            let key = format!("k{round}").into_bytes();
            // 64 checks queued at once: an idle connection sends them as two
            // batches, and the stragglers follow while those are out.
            let admitted = admitted_of_a_crowd(&store, &key, &policy, 64).await;
            assert_eq!(admitted, 10, "round {round}");
        }
    });
}

/// Queues `n` checks of `key` at once (each polled once as it is made, so
/// the batcher sees them together), then waits for them: how many were
/// admitted.
pub(crate) async fn admitted_of_a_crowd(
    store: &RedisStore,
    key: &[u8],
    policy: &Policy,
    n: usize,
) -> u32 {
    let mut calls = Vec::new();
    for _ in 0..n {
        let mut call = Box::pin(store.check(Charge::new(key, policy, 1)));
        let early = std::future::poll_fn(|cx| {
            Poll::Ready(match call.as_mut().poll(cx) {
                Poll::Ready(d) => Some(d.unwrap().allowed),
                Poll::Pending => None,
            })
        })
        .await;
        calls.push((call, early));
    }
    let mut admitted = 0;
    for (call, early) in calls {
        let allowed = match early {
            Some(allowed) => allowed,
            None => call.await.unwrap().allowed,
        };
        admitted += u32::from(allowed);
    }
    admitted
}

fn pttl(server: &RedisServer, key: &[u8]) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

/// Real time between the write that set a key's expiry and its PTTL read
/// (the frozen test clock does not move, the key's TTL does): at most this,
/// or what a stalled machine took, measured (see [`LastSet`]).
const READ_SLACK_MS: i64 = 50;

/// A key's PTTL against the state it must keep: at least until its tat
/// (`reset_after` from now), at most a second (the expiry step) after. A
/// TTL counts down in real time while the test clock jumps: a key whose
/// expiry was last set before jumps totalling `jumped` may outlive its tat
/// by that much more in test time, never less; and it has counted down for
/// the real time since that expiry was set, `since_set_ms` (up to
/// [`READ_SLACK_MS`] on a machine that does not stall).
fn assert_expiry_covers(
    step: &str,
    ttl: i64,
    reset_after: Duration,
    jumped: Duration,
    since_set_ms: i64,
) {
    let need = i64::try_from(reset_after.as_millis()).unwrap();
    let most = need + 1000 + 1 + i64::try_from(jumped.as_millis()).unwrap();
    let slack = since_set_ms.max(READ_SLACK_MS);
    assert!(
        ttl >= need - slack && ttl <= most,
        "{step}: PTTL {ttl} ms for state that must live {need} ms (at most {most}, \
         slack {slack} ms)"
    );
}

/// Real time since `at`, in ms rounded up.
fn ms_since(at: Instant) -> i64 {
    i64::try_from(at.elapsed().as_millis()).unwrap() + 1
}

/// The tat a decision of `store`'s clock reports (µs of the test clock).
fn tat_us(clock: &ManualClock, d: &Decision) -> u64 {
    clock.now_ns() / 1000 + u64::try_from(d.reset_after.as_micros()).unwrap()
}

/// When a GCRA key's expiry was last set: a write moves it only to a later
/// second than the one its stored tat expires at (`gcra_write` in
/// gcra.lua), so the test knows which writes set it, and from when to
/// measure the real time its TTL has counted down.
struct LastSet {
    /// The expiry the scripts gave the key (µs of the test clock).
    expiry_us: Option<u64>,
    /// Before the write that set it was sent.
    at: Instant,
}

impl LastSet {
    fn new() -> LastSet {
        LastSet {
            expiry_us: None,
            at: Instant::now(),
        }
    }

    /// Writes sent from `sent` on left the key at `tat` (µs).
    fn wrote(&mut self, sent: Instant, tat: u64) {
        // gcra_expiry: the tat rounded up to a whole second.
        let expiry = tat.div_ceil(1_000_000) * 1_000_000;
        if self.expiry_us.is_none_or(|set| expiry > set) {
            self.expiry_us = Some(expiry);
            self.at = sent;
        }
    }

    fn since_ms(&self) -> i64 {
        ms_since(self.at)
    }
}

#[test]
fn a_busy_key_never_expires_before_its_tat() {
    let server = RedisServer::start();
    // Not on a whole second, so admissions cross second boundaries at
    // different steps.
    let clock = ManualClock::starting_at(1_700_000_000_250_000_000);
    runtime().block_on(async {
        let store = store_on(&server, &clock).await;
        // T = 300 ms, τ = 6 s: each admission moves the tat 300 ms on, and
        // only some of them past the second its expiry was rounded up to.
        let policy = Policy::cell(20, 10, Duration::from_secs(3)).unwrap();
        let key = store.redis_key(b"busy", &policy);
        let mut jumped = Duration::ZERO;
        let mut receipts = Vec::new();
        let mut last_set = LastSet::new();
        for i in 0..36 {
            let sent = Instant::now();
            let d = store.check(Charge::new(b"busy", &policy, 1)).await.unwrap();
            assert!(d.allowed, "admission {i}");
            receipts.extend(d.receipt());
            last_set.wrote(sent, tat_us(&clock, &d));
            let ttl = pttl(&server, &key);
            assert_expiry_covers(
                &format!("admission {i}"),
                ttl,
                d.reset_after,
                jumped,
                last_set.since_ms(),
            );
            // Time catches up now and then: the tat restarts from now.
            if i % 8 == 7 {
                clock.advance(Duration::from_millis(2_700));
                jumped += Duration::from_millis(2_700);
            }
        }
        // A refund moves the expiry back with the tat.
        let before = store
            .check(Charge::new(b"busy", &policy, 0))
            .await
            .unwrap()
            .reset_after;
        // The last three charges, whose debt is all still ahead.
        let refunded = Instant::now();
        for receipt in &receipts[receipts.len() - 3..] {
            store.refund(b"busy", &policy, receipt).await.unwrap();
        }
        let after = store
            .check(Charge::new(b"busy", &policy, 0))
            .await
            .unwrap()
            .reset_after;
        assert_eq!(before - after, Duration::from_millis(900));
        // Written whole: no earlier expiry carries over.
        assert_expiry_covers(
            "after a refund",
            pttl(&server, &key),
            after,
            Duration::ZERO,
            ms_since(refunded),
        );
    });
}

#[test]
fn batched_and_multi_rule_checks_keep_the_invariant() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_600_000_000);
    let rt = runtime();
    rt.block_on(async {
        let store = store_on(&server, &clock).await;
        let fast = Policy::cell(50, 10, Duration::from_secs(1)).unwrap(); // T = 100 ms
        let slow = Policy::cell(50, 2, Duration::from_secs(1)).unwrap(); // T = 500 ms
        let users: Vec<String> = (0..16).map(|u| format!("u{u}")).collect();
        let mut last_set: Vec<LastSet> = users.iter().map(|_| LastSet::new()).collect();
        for round in 0..12 {
            let sent = Instant::now();
            // Concurrent single-rule checks: they gather into batches,
            // several of them on the same key.
            let tasks: Vec<_> = (0..48)
                .map(|n| {
                    let (store, fast, user) = (store.clone(), fast, users[n % 16].clone());
                    tokio::spawn(async move {
                        store
                            .check(Charge::new(user.as_bytes(), &fast, 1))
                            .await
                            .unwrap()
                    })
                })
                .collect();
            for t in tasks {
                assert!(t.await.unwrap().allowed, "round {round}");
            }
            // Two policies in one check: the general script's path.
            let user = &users[round % 16];
            let both = store
                .check_all(&[
                    Charge::new(user.as_bytes(), &fast, 1),
                    Charge::new(format!("s:{user}").as_bytes(), &slow, 1),
                ])
                .await
                .unwrap();
            assert!(both.iter().all(|d| d.allowed), "round {round}: {both:?}");
            for (user, last_set) in users.iter().zip(&mut last_set) {
                let d = store
                    .check(Charge::new(user.as_bytes(), &fast, 0))
                    .await
                    .unwrap();
                // This round's checks (all admitted) wrote the key.
                last_set.wrote(sent, tat_us(&clock, &d));
                let ttl = pttl(&server, &store.redis_key(user.as_bytes(), &fast));
                let jumped = Duration::from_millis(130 * round as u64);
                assert_expiry_covers(
                    &format!("round {round}, {user}"),
                    ttl,
                    d.reset_after,
                    jumped,
                    last_set.since_ms(),
                );
            }
            let s = format!("s:{user}");
            let d = store
                .check(Charge::new(s.as_bytes(), &slow, 0))
                .await
                .unwrap();
            let ttl = pttl(&server, &store.redis_key(s.as_bytes(), &slow));
            let jumped = Duration::from_millis(130 * round as u64);
            // Each user's slow key is written once, by this round's check.
            assert_expiry_covers(
                &format!("round {round}, {s}"),
                ttl,
                d.reset_after,
                jumped,
                ms_since(sent),
            );
            clock.advance(Duration::from_millis(130));
        }
    });
}

#[test]
fn a_value_incrby_cannot_parse_is_replaced_whole() {
    let server = RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_250_000_000);
    runtime().block_on(async {
        let store = store_on(&server, &clock).await;
        let policy = Policy::cell(20, 10, Duration::from_secs(3)).unwrap();
        let key = store.redis_key(b"odd", &policy);
        // A tat 1 s ahead (in ns modulo 1000·2^43, as gcra.lua stores
        // it), written as a float (never by this crate).
        let wrap = 1000u64 << 43;
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(format!("{}.0", 1_700_000_001_250_000_000u64 % wrap))
            .arg("PX")
            .arg(10_000)
            .query(&mut server.conn())
            .unwrap();
        let sent = Instant::now();
        let d = store.check(Charge::new(b"odd", &policy, 1)).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.reset_after, Duration::from_millis(1_300));
        let stored: String = redis::cmd("GET")
            .arg(&key)
            .query(&mut server.conn())
            .unwrap();
        assert_eq!(stored, (1_700_000_001_550_000_000u64 % wrap).to_string());
        assert_expiry_covers(
            "rewritten",
            pttl(&server, &key),
            d.reset_after,
            Duration::ZERO,
            ms_since(sent),
        );
    });
}

/// A fixed-window key expires at its window's end: the first write of a
/// window sets that expiry, and the later writes of the same window keep
/// it (`SET … KEEPTTL`) instead of setting it again; the next window's
/// first write sets the next end. The count carries on exactly.
#[test]
fn a_fixed_window_key_keeps_the_expiry_its_window_set() {
    let server = RedisServer::start();
    runtime().block_on(async {
        let clock = ManualClock::new();
        let window = Duration::from_secs(60);
        let w_ns = u64::try_from(window.as_nanos()).unwrap();
        // One second into a window.
        clock.set_ns((clock.now_ns() / w_ns + 10) * w_ns + 1_000_000_000);
        let store = store_on(&server, &clock).await;
        let policy = Policy::fixed_window(3, window).unwrap();
        let key = store.redis_key(b"u", &policy);
        let check = || store.check(Charge::new(b"u", &policy, 1));
        let first_set = Instant::now();
        assert!(check().await.unwrap().allowed);
        // The window's end, 59 s away.
        assert_expiry_covers(
            "first write",
            pttl(&server, &key),
            Duration::from_secs(59),
            Duration::ZERO,
            ms_since(first_set),
        );
        // 20 s later in the same window: the expiry is still the one the
        // first write set (59 s of real TTL, not 39 s).
        clock.advance(Duration::from_secs(20));
        let d = check().await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
        let ttl = pttl(&server, &key);
        assert!(
            ttl > 59_000 - ms_since(first_set).max(READ_SLACK_MS),
            "PTTL {ttl} ms: the expiry moved"
        );
        assert!(check().await.unwrap().allowed);
        assert!(!check().await.unwrap().allowed, "the limit of 3 holds");
        // The next window: a fresh count, and its own end set.
        clock.advance(Duration::from_secs(40));
        let next_set = Instant::now();
        let d = check().await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 2);
        assert_expiry_covers(
            "next window",
            pttl(&server, &key),
            Duration::from_secs(59),
            Duration::ZERO,
            ms_since(next_set),
        );
    });
}
