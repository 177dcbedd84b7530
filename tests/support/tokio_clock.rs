//! Store time that follows tokio's clock, so `tokio::time::pause` drives
//! both the layer's waits and the store's decisions. Shared through `#[path]`.

use tower_throttle::clock::Clock;
use tower_throttle::MemoryStore;

/// Nanoseconds since the instant it was built, plus one second (so no
/// reading is 0).
pub struct TokioClock(pub tokio::time::Instant);

impl Clock for TokioClock {
    fn now_ns(&self) -> u64 {
        1_000_000_000 + self.0.elapsed().as_nanos() as u64
    }
}

/// A memory store on a [`TokioClock`] started now.
pub fn tokio_store() -> MemoryStore<TokioClock> {
    MemoryStore::builder()
        .clock(TokioClock(tokio::time::Instant::now()))
        .build()
}
