//! Which store decides: the switch to the fallback and back, the probe,
//! errors that are not outages, and the primary's share of a budget.

use std::task::{Context, Poll, Waker};

use super::*;

#[test]
fn the_fallback_decides_while_the_primary_is_down_then_hands_back() {
    let (clock, primary, store) = setup();
    let p = window(3);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        let d = store.check(rule).await.unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.decided_by),
            (true, 2, DecidedBy::Primary)
        );
        primary.set(DOWN);
        // The fallback's own state: a fresh key, the same limit, never unlimited.
        let answers: Vec<_> = futures(&store, rule, 4).await;
        assert!(answers.iter().all(|d| d.decided_by == DecidedBy::Fallback));
        let allowed: Vec<bool> = answers.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, false]);
        assert!(store.is_on_fallback());
        // Within the probe interval the primary is not asked at all.
        assert_eq!(primary.calls(), 2, "one success, one failure");
        // Back up: nothing changes until the interval ends...
        primary.set(0);
        assert_eq!(
            store.check(rule).await.unwrap().decided_by,
            DecidedBy::Fallback
        );
        assert_eq!(primary.calls(), 2);
        // ...then the next call probes, and the primary's state is where it was.
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let d = store.check(rule).await.unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.decided_by),
            (true, 1, DecidedBy::Primary)
        );
        assert!(!store.is_on_fallback());
    });
}

#[test]
fn a_failed_probe_keeps_the_fallback_for_another_interval() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    block_on(async {
        primary.set(DOWN);
        store.check(rule).await.unwrap();
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let d = store.check(rule).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        assert_eq!(primary.calls(), 2, "the probe reached the primary");
        clock.advance(DEFAULT_PROBE_INTERVAL / 2);
        store.check(rule).await.unwrap();
        assert_eq!(
            primary.calls(),
            2,
            "the failed probe restarted the interval"
        );
    });
}

#[test]
fn other_errors_are_not_hidden_by_the_fallback() {
    let (_clock, primary, store) = setup();
    let p = window(10);
    let twice = [Charge::new(b"k", &p, 1), Charge::new(b"k", &p, 1)];
    let err = block_on(store.check_all(&twice)).unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err}");
    assert!(!store.is_on_fallback());
    assert_eq!(primary.calls(), 1);
}

#[test]
fn on_fallback_an_in_process_fallback_decides_without_a_future() {
    let (_clock, primary, store) = setup();
    let p = window(1);
    let rule = Charge::new(b"k", &p, 1);
    assert!(store.at_once(rule).is_none(), "the primary is remote");
    primary.set(DOWN);
    assert!(block_on(store.check(rule)).unwrap().allowed);
    let d = store.at_once(rule).expect("decided at once").unwrap();
    assert_eq!((d.allowed, d.decided_by), (false, DecidedBy::Fallback));
    let ds = store
        .all_at_once(&[rule])
        .expect("decided at once")
        .unwrap();
    assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
}

#[test]
fn a_probe_dropped_mid_call_lets_the_next_call_probe() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    primary.set(DOWN);
    block_on(store.check(rule)).unwrap();
    clock.advance(DEFAULT_PROBE_INTERVAL);
    primary.set(HANG);
    {
        let mut probe = Box::pin(store.check(rule));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(probe.as_mut().poll(&mut cx), Poll::Pending));
        // While it hangs, others are answered by the fallback.
        let d = block_on(store.check(rule)).unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
    }
    primary.set(0);
    let d = block_on(store.check(rule)).unwrap();
    assert_eq!(d.decided_by, DecidedBy::Primary, "the claim was given back");
}

/// Under a caller's budget (a layer's `store_timeout`) shorter than a
/// stalled primary takes, the primary gets three quarters of it and the
/// fallback answers within it: the caller's timeout is never reached.
/// The failure opens the probe interval as any other.
#[test]
fn a_stalled_primary_leaves_the_fallback_its_part_of_the_callers_budget() {
    let (clock, primary, store) = setup();
    let p = window(10);
    let rule = Charge::new(b"k", &p, 1);
    primary.set(HANG);
    let budget = Duration::from_millis(50);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let started = tokio::time::Instant::now();
        let d = budget::within(budget, store.check(rule)).await.unwrap();
        assert_eq!(d.decided_by, DecidedBy::Fallback);
        assert!(started.elapsed() < budget, "{:?}", started.elapsed());
        assert!(store.is_on_fallback());
        let ds = budget::within(budget, store.check_all(&[rule]))
            .await
            .unwrap();
        assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
        assert_eq!(primary.calls(), 1, "not asked within the probe interval");
        // The probe after the interval stalls too: its share, then the fallback.
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let started = tokio::time::Instant::now();
        let ds = budget::within(budget, store.check_all(&[rule]))
            .await
            .unwrap();
        assert_eq!(ds[0].decided_by, DecidedBy::Fallback);
        assert!(started.elapsed() < budget, "{:?}", started.elapsed());
        assert_eq!(primary.calls(), 2);
        // Without a budget the primary's own bound applies (here: none).
        clock.advance(DEFAULT_PROBE_INTERVAL);
        let alone = tokio::time::timeout(Duration::from_secs(3600), store.check(rule)).await;
        assert!(alone.is_err(), "no share without a caller's budget");
    });
}
