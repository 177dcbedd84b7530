//! A `tracing` subscriber that keeps every event, for tests that assert
//! what the crate logs (and how often).
//!
//! Include with `#[path = "support/capture.rs"] mod capture;`, and install
//! one per test binary ([`Capture::install`]).
#![allow(dead_code)]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every event: its level, target, and fields as `name=value` pairs.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<(Level, String, String)>>>);

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

impl Capture {
    /// The subscriber of this test binary, installed by the first caller.
    pub fn install() -> Capture {
        static GLOBAL: OnceLock<Capture> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let capture = Capture::default();
                tracing::subscriber::set_global_default(capture.clone())
                    .expect("no other global subscriber");
                capture
            })
            .clone()
    }

    /// Every event so far, one a line (for a failing assertion's message).
    pub fn dump(&self) -> String {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .map(|(l, target, text)| format!("{l} {target}: {text}\n"))
            .collect()
    }

    /// The events of target `tower_throttle` at `level` whose fields contain
    /// every one of `needles`.
    pub fn count_all(&self, level: Level, needles: &[&str]) -> usize {
        let events = self.0.lock().unwrap();
        events
            .iter()
            .filter(|(l, target, text)| {
                *l == level
                    && target == "tower_throttle"
                    && needles.iter().all(|n| text.contains(n))
            })
            .count()
    }

    /// The events of target `tower_throttle` at `level` whose fields contain
    /// `needle`.
    pub fn count(&self, level: Level, needle: &str) -> usize {
        self.count_all(level, &[needle])
    }
}
