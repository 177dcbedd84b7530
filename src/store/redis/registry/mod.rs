//! The one table of what the Redis store runs: the algorithms, each one code
//! on the wire ([`ScriptAlgorithm`]), and the Lua scripts ([`ScriptId`]).
//!
//! Every script is assembled here from the Lua sources its algorithms need,
//! [`RedisStore::load_scripts`](super::RedisStore::load_scripts) loads
//! [`ScriptId::ALL`], and the batch code picks its script from a
//! [`ScriptAlgorithm`]. Every `match` here is exhaustive: a new algorithm
//! does not compile until it has a key code, a wire code, Lua sources, a
//! check script and a batch mode.

use std::sync::LazyLock;

use redis::Script;

use crate::policy::{Algorithm, Policy};

/// The Lua sources, each included once.
mod lua {
    pub(super) const COMMON: &str = include_str!("../scripts/common.lua");
    pub(super) const GCRA: &str = include_str!("../scripts/gcra.lua");
    pub(super) const WINDOW: &str = include_str!("../scripts/window.lua");
    pub(super) const FIXED_WINDOW: &str = include_str!("../scripts/fixed_window.lua");
    pub(super) const SLIDING_WINDOW: &str = include_str!("../scripts/sliding_window.lua");
    pub(super) const SLIDING_LOG: &str = include_str!("../scripts/sliding_log.lua");
    pub(super) const CONCURRENCY: &str = include_str!("../scripts/concurrency.lua");
    pub(super) const CHECK: &str = include_str!("../scripts/check.lua");
    pub(super) const GCRA_BATCH: &str = include_str!("../scripts/gcra_batch.lua");
    pub(super) const FIXED_BATCH: &str = include_str!("../scripts/fixed_batch.lua");
    pub(super) const REFUND: &str = include_str!("../scripts/refund.lua");
    pub(super) const RELEASE: &str = include_str!("../scripts/release.lua");
}

/// Every Lua source (tests scan them).
#[cfg(test)]
pub(crate) fn lua_sources() -> [&'static str; 12] {
    [
        lua::COMMON,
        lua::GCRA,
        lua::WINDOW,
        lua::FIXED_WINDOW,
        lua::SLIDING_WINDOW,
        lua::SLIDING_LOG,
        lua::CONCURRENCY,
        lua::CHECK,
        lua::GCRA_BATCH,
        lua::FIXED_BATCH,
        lua::REFUND,
        lua::RELEASE,
    ]
}

/// An algorithm as the scripts know it: one per [`Algorithm`] variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScriptAlgorithm {
    Gcra,
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    Concurrency,
}

impl ScriptAlgorithm {
    /// Every algorithm, in the order the full scripts include them.
    pub(crate) const ALL: [ScriptAlgorithm; 5] = [
        ScriptAlgorithm::Gcra,
        ScriptAlgorithm::FixedWindow,
        ScriptAlgorithm::SlidingWindow,
        ScriptAlgorithm::SlidingLog,
        ScriptAlgorithm::Concurrency,
    ];

    /// The algorithm of `policy`.
    pub(crate) fn of(policy: &Policy) -> ScriptAlgorithm {
        match policy.algorithm() {
            Algorithm::Gcra(_) => ScriptAlgorithm::Gcra,
            Algorithm::FixedWindow(_) => ScriptAlgorithm::FixedWindow,
            Algorithm::SlidingWindow(_) => ScriptAlgorithm::SlidingWindow,
            Algorithm::SlidingLog(_) => ScriptAlgorithm::SlidingLog,
            Algorithm::Concurrency(_) => ScriptAlgorithm::Concurrency,
        }
    }

    /// Its name in Redis keys (`<prefix>:{<tag>}:<code>:<key>`): stable,
    /// since changing it orphans every stored state. A new state format
    /// takes a new code, so that no reader misreads the old one: GCRA's
    /// tats are in ns modulo 1000·2^43 under `gn` (under `g`, builds before
    /// 0.1.0 kept µs, and those keys expire by themselves).
    pub(crate) fn key_code(self) -> &'static str {
        match self {
            ScriptAlgorithm::Gcra => "gn",
            ScriptAlgorithm::FixedWindow => "f",
            ScriptAlgorithm::SlidingWindow => "s",
            ScriptAlgorithm::SlidingLog => "l",
            ScriptAlgorithm::Concurrency => "c",
        }
    }

    /// The Lua library files defining it (after `common.lua`).
    fn sources(self) -> &'static [&'static str] {
        match self {
            ScriptAlgorithm::Gcra => &[lua::GCRA],
            ScriptAlgorithm::FixedWindow => &[lua::WINDOW, lua::FIXED_WINDOW],
            ScriptAlgorithm::SlidingWindow => &[lua::WINDOW, lua::SLIDING_WINDOW],
            ScriptAlgorithm::SlidingLog => &[lua::SLIDING_LOG],
            ScriptAlgorithm::Concurrency => &[lua::CONCURRENCY],
        }
    }

    /// The check script holding only this algorithm.
    pub(crate) fn check_script(self) -> ScriptId {
        match self {
            ScriptAlgorithm::Gcra => ScriptId::CheckGcra,
            ScriptAlgorithm::FixedWindow => ScriptId::CheckFixedWindow,
            ScriptAlgorithm::SlidingWindow => ScriptId::CheckSlidingWindow,
            ScriptAlgorithm::SlidingLog => ScriptId::CheckSlidingLog,
            ScriptAlgorithm::Concurrency => ScriptId::CheckConcurrency,
        }
    }
}

/// How a batch of identical single-rule checks (one policy and cost) is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UniformBatch {
    /// A GCRA batch script of its own: no per-check arguments, one number
    /// per check in the reply.
    Gcra(ScriptId),
    /// The check script's `U` mode (no per-check arguments), run by this
    /// check script.
    SharedArguments(ScriptId),
    /// The `U` mode's arguments, run by a loop of its own that answers one
    /// item per check (`fixed_batch.lua`).
    Fixed(ScriptId),
    /// Per-check arguments, as a mixed batch.
    PerCheck,
}

impl ScriptAlgorithm {
    /// Its code as the scripts read it (`algo[code]` in `common.lua`). Its
    /// parameters travel as a count and a duration in ns; the windows, the
    /// log and the lease run in µs where the duration is whole µs (`pick`
    /// in `common.lua`), GCRA in ns throughout.
    pub(crate) fn wire(self) -> &'static str {
        match self {
            ScriptAlgorithm::Gcra => "g",
            ScriptAlgorithm::FixedWindow => "f",
            ScriptAlgorithm::SlidingWindow => "s",
            ScriptAlgorithm::SlidingLog => "l",
            ScriptAlgorithm::Concurrency => "c",
        }
    }

    /// How a uniform batch of it is sent: `whole_us` says whether its
    /// duration is whole µs (the fixed window's batch loop runs in µs).
    /// Concurrency checks carry a permit id each, so they always go per
    /// check.
    pub(crate) fn uniform_batch(self, whole_us: bool) -> UniformBatch {
        match self {
            ScriptAlgorithm::Gcra => UniformBatch::Gcra(ScriptId::GcraBatch),
            ScriptAlgorithm::FixedWindow if whole_us => UniformBatch::Fixed(ScriptId::FixedBatch),
            ScriptAlgorithm::FixedWindow
            | ScriptAlgorithm::SlidingWindow
            | ScriptAlgorithm::SlidingLog => UniformBatch::SharedArguments(self.check_script()),
            ScriptAlgorithm::Concurrency => UniformBatch::PerCheck,
        }
    }
}

/// Every script the store runs. The discriminant indexes [`SCRIPTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScriptId {
    /// Every algorithm: for checks mixing algorithms.
    Check,
    /// Checks whose rules are all GCRA.
    CheckGcra,
    /// Checks whose rules are all fixed windows.
    CheckFixedWindow,
    /// Checks whose rules are all sliding windows.
    CheckSlidingWindow,
    /// Checks whose rules are all sliding logs.
    CheckSlidingLog,
    /// Checks whose rules are all concurrency limits.
    CheckConcurrency,
    /// Single-rule GCRA checks under one policy and cost (`gcra_batch.lua`).
    GcraBatch,
    /// Single-rule fixed-window checks (windows in whole µs) under one
    /// policy and cost (`fixed_batch.lua`).
    FixedBatch,
    /// Refunds, any algorithm.
    Refund,
    /// Concurrency releases.
    Release,
}

impl ScriptId {
    /// Every script, in discriminant order: what `load_scripts` loads.
    pub(crate) const ALL: [ScriptId; 10] = [
        ScriptId::Check,
        ScriptId::CheckGcra,
        ScriptId::CheckFixedWindow,
        ScriptId::CheckSlidingWindow,
        ScriptId::CheckSlidingLog,
        ScriptId::CheckConcurrency,
        ScriptId::GcraBatch,
        ScriptId::FixedBatch,
        ScriptId::Refund,
        ScriptId::Release,
    ];

    /// The Lua source files, in order (after `common.lua`).
    fn sources(self) -> Vec<&'static str> {
        let only = |a: ScriptAlgorithm, main: &'static str| [a.sources(), &[main]].concat();
        // Every algorithm's sources, each once (the windows share one).
        let every = |main: &'static str| {
            let mut all: Vec<&'static str> = Vec::new();
            for source in ScriptAlgorithm::ALL.iter().flat_map(|a| a.sources()) {
                if !all.iter().any(|s| std::ptr::eq(*s, *source)) {
                    all.push(source);
                }
            }
            all.push(main);
            all
        };
        match self {
            ScriptId::Check => every(lua::CHECK),
            ScriptId::CheckGcra => only(ScriptAlgorithm::Gcra, lua::CHECK),
            ScriptId::CheckFixedWindow => only(ScriptAlgorithm::FixedWindow, lua::CHECK),
            ScriptId::CheckSlidingWindow => only(ScriptAlgorithm::SlidingWindow, lua::CHECK),
            ScriptId::CheckSlidingLog => only(ScriptAlgorithm::SlidingLog, lua::CHECK),
            ScriptId::CheckConcurrency => only(ScriptAlgorithm::Concurrency, lua::CHECK),
            // The batch scripts need GCRA's helpers, not the check loop.
            ScriptId::GcraBatch => vec![lua::GCRA, lua::GCRA_BATCH],
            ScriptId::FixedBatch => vec![lua::WINDOW, lua::FIXED_WINDOW, lua::FIXED_BATCH],
            ScriptId::Refund => every(lua::REFUND),
            ScriptId::Release => only(ScriptAlgorithm::Concurrency, lua::RELEASE),
        }
    }

    /// The loaded-once script.
    pub(crate) fn script(self) -> &'static Script {
        &SCRIPTS[self as usize]
    }
}

/// The scripts, indexed by [`ScriptId`], each `common.lua` and its sources.
static SCRIPTS: LazyLock<[Script; ScriptId::ALL.len()]> = LazyLock::new(|| {
    ScriptId::ALL.map(|id| {
        Script::new(
            &[lua::COMMON]
                .into_iter()
                .chain(id.sources())
                .collect::<String>(),
        )
    })
});

/// The smallest check script that holds every algorithm of `policies`.
pub(crate) fn check_script<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> ScriptId {
    let mut algorithms = policies.into_iter().map(ScriptAlgorithm::of);
    match algorithms.next() {
        Some(first) if algorithms.all(|a| a == first) => first.check_script(),
        _ => ScriptId::Check,
    }
}

#[cfg(test)]
mod tests;
