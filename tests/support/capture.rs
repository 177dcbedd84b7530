//! The crate's `tracing` events, captured by a subscriber installed once
//! for the whole test binary, so a test can count what was logged at which
//! level. Shared through `#[path]`:
//! `#[path = "support/capture.rs"] mod capture;`.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every event: its level, target, and fields as `name=value` pairs.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<(Level, String, String)>>>);

static INSTALLED: OnceLock<Capture> = OnceLock::new();

impl Capture {
    /// The binary's capture, installed as the global subscriber by the
    /// first call (tests of one binary share it: each looks for its own
    /// causes).
    pub fn install() -> Capture {
        INSTALLED
            .get_or_init(|| {
                let capture = Capture::default();
                tracing::subscriber::set_global_default(capture.clone())
                    .expect("no other global subscriber in this binary");
                capture
            })
            .clone()
    }

    /// The crate's events at `level` whose fields contain `needle`.
    pub fn count(&self, level: Level, needle: &str) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, target, text)| {
                *l == level && target == "tower_throttle" && text.contains(needle)
            })
            .count()
    }
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={value:?} ", field.name());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let meta = event.metadata();
        let entry = (*meta.level(), meta.target().to_owned(), fields.0);
        self.0.lock().unwrap().push(entry);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
