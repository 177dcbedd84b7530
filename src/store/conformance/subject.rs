//! What the suite is given: a store as a [`Subject`], with its clock and
//! its [`Caps`]; and the keys and times it is asked about.

use std::time::Duration;

use crate::store::Store;

/// What a store supports beyond plain checks.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Sliding logs, windows and concurrency (not only GCRA).
    pub all_algorithms: bool,
    /// GCRA only as `Policy::cell` builds it (redis-cell takes its own
    /// arguments; the other GCRA constructors are refused as config errors).
    pub cell_only: bool,
    /// Checks of cost 0 report without charging.
    pub peek: bool,
    /// `refund` gives units back.
    pub refund: bool,
    /// `reset` forgets a key.
    pub reset: bool,
    /// `check_all` over several rules.
    pub multi_rule: bool,
    /// `reset_after` equals the model's; otherwise it is only an upper bound.
    pub exact_reset: bool,
    /// The store's clock resolution: the model sees times rounded down to it.
    pub resolution: Duration,
}

impl Caps {
    /// Everything, at nanosecond resolution (the memory store).
    pub const FULL: Caps = Caps {
        all_algorithms: true,
        cell_only: false,
        peek: true,
        refund: true,
        reset: true,
        multi_rule: true,
        exact_reset: true,
        resolution: Duration::from_nanos(1),
    };
}

/// A store under test and the clock it decides on.
pub struct Subject<S> {
    /// For messages.
    pub name: &'static str,
    /// The store.
    pub store: S,
    /// Moves the store's clock forward.
    pub advance: Box<dyn Fn(Duration) + Send + Sync>,
    /// The store's clock now, in ns (absolute where windows align to it).
    pub now_ns: Box<dyn Fn() -> u64 + Send + Sync>,
    /// What the store supports.
    pub caps: Caps,
    /// Prefixes every key, so runs on one shared server do not meet.
    pub key_prefix: String,
}

/// The subject's key for `what` of the policy `name`, under its prefix.
pub(super) fn key(subject: &Subject<impl Store>, name: &str, what: &str) -> Vec<u8> {
    format!("{}:{what}:{name}", subject.key_prefix).into_bytes()
}

/// The subject's clock now, rounded down to its resolution, as the model
/// sees it.
pub(super) fn model_now(subject: &Subject<impl Store>) -> u64 {
    let res = subject.caps.resolution.as_nanos() as u64;
    (subject.now_ns)() / res * res
}
