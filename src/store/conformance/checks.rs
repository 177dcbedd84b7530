//! The suite's checks beyond the walk: expiry, all or nothing, concurrency
//! permits and typed errors.

use std::time::Duration;

use super::subject::{key, Subject};
use crate::policy::{Algorithm, Policy};
use crate::store::{Charge, Store, StoreError};

/// A key used up and left alone for its window (plus a lease or burst) is
/// fresh again.
pub(super) async fn expiry<S: Store>(subject: &Subject<S>, name: &str, policy: &Policy) {
    let key = key(subject, name, "expiry");
    let limit = policy.limit();
    for _ in 0..limit + 1 {
        let _ = subject
            .store
            .check(Charge::new(&key, policy, 1))
            .await
            .unwrap();
    }
    let d = subject
        .store
        .check(Charge::new(&key, policy, 1))
        .await
        .unwrap();
    assert!(!d.allowed, "{} / {name}: used up", subject.name);
    (subject.advance)(d.reset_after + policy.window() + Duration::from_secs(1));
    for i in 0..limit {
        let d = subject
            .store
            .check(Charge::new(&key, policy, 1))
            .await
            .unwrap();
        assert!(
            d.allowed,
            "{} / {name}: unit {i} after expiry",
            subject.name
        );
    }
}

/// One rule denying means nothing is charged to the others.
pub(super) async fn all_or_nothing<S: Store>(subject: &Subject<S>) {
    let open = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    let shut = Policy::cell(0, 1, Duration::from_secs(60)).unwrap();
    let (a, b) = (key(subject, "a", "multi"), key(subject, "b", "multi"));
    let first = subject
        .store
        .check(Charge::new(&b, &shut, 1))
        .await
        .unwrap();
    assert!(first.allowed, "{}: the one unit of b", subject.name);
    for _ in 0..3 {
        let ds = subject
            .store
            .check_all(&[Charge::new(&a, &open, 1), Charge::new(&b, &shut, 1)])
            .await
            .unwrap();
        assert!(ds[0].allowed && !ds[1].allowed, "{}: {ds:?}", subject.name);
        assert_eq!(ds[0].remaining, 10, "{}: a was not charged", subject.name);
    }
    let d = subject.store.check(Charge::new(&a, &open, 0)).await;
    if subject.caps.peek {
        assert_eq!(d.unwrap().remaining, 10, "{}: a untouched", subject.name);
    }
}

/// Permits: distinct ids, the limit holds, a release frees one.
pub(super) async fn concurrency_permits<S: Store>(subject: &Subject<S>) {
    let policy = Policy::concurrency(3).unwrap();
    let key = key(subject, "permits", "conc");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let d = subject
            .store
            .check(Charge::new(&key, &policy, 1))
            .await
            .unwrap();
        assert!(d.allowed, "{}: a permit", subject.name);
        ids.push(
            d.permit
                .expect("an admitted concurrency check holds a permit"),
        );
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{}: permit ids are distinct", subject.name);
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(!d.allowed, "{}: the limit holds", subject.name);
    subject.store.release(&key, &policy, ids[1]).await.unwrap();
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(d.allowed, "{}: a release frees a permit", subject.name);
    // Releasing twice, or an unknown permit, changes nothing.
    subject.store.release(&key, &policy, ids[1]).await.unwrap();
    let d = subject
        .store
        .check(Charge::new(&key, &policy, 1))
        .await
        .unwrap();
    assert!(
        !d.allowed,
        "{}: a double release frees nothing",
        subject.name
    );
    for id in ids {
        let _ = subject.store.release(&key, &policy, id).await;
    }
    if let Some(p) = d.permit {
        let _ = subject.store.release(&key, &policy, p).await;
    }
}

/// Bad requests are typed errors, never panics.
pub(super) async fn typed_errors<S: Store>(subject: &Subject<S>) {
    let policy = Policy::cell(1, 1, Duration::from_secs(1)).unwrap();
    let k = key(subject, "dup", "errors");
    if subject.caps.multi_rule {
        let r = subject
            .store
            .check_all(&[Charge::new(&k, &policy, 1), Charge::new(&k, &policy, 1)])
            .await;
        assert!(
            matches!(r, Err(StoreError::InvalidRequest(_))),
            "{}: two rules on one key: {r:?}",
            subject.name
        );
    }
    // A cost no policy can ever admit is a denial forever, not an error.
    let d = subject
        .store
        .check(Charge::new(&k, &policy, u64::MAX))
        .await
        .unwrap();
    assert!(d.is_never(), "{}: {d:?}", subject.name);
    if !subject.caps.all_algorithms {
        let log = Policy::sliding_log(1, Duration::from_secs(1)).unwrap();
        let r = subject.store.check(Charge::new(&k, &log, 1)).await;
        assert!(
            matches!(r, Err(StoreError::Unsupported(_))),
            "{}: an unsupported algorithm: {r:?}",
            subject.name
        );
    }
    assert!(matches!(policy.algorithm(), Algorithm::Gcra(_)));
}
