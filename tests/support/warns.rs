//! A tracing subscriber that listens at every level, as a debug one does,
//! and counts the `WARN` events it sees. Shared through `#[path]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts `WARN` events on the thread where it is the default.
pub struct Warns(pub Arc<AtomicUsize>);

impl tracing::Subscriber for Warns {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// How many `WARN` events `f` gave.
#[allow(dead_code)] // Not every suite counts.
pub fn warnings_during(f: impl FnOnce()) -> usize {
    let count = Arc::new(AtomicUsize::new(0));
    tracing::subscriber::with_default(Warns(count.clone()), f);
    count.load(Ordering::Relaxed)
}
