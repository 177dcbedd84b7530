//! Logs as upstream's `LOG_LEVEL` and `LOG_FORMAT` ask, on stderr, with
//! one difference: the start line and the shutdown line
//! ([`crate::server::START_TARGET`]) are shown at INFO whatever the level,
//! unless `LOG_LEVEL` is `error` (or `fatal`, `panic`): what a server is
//! doing is said once at the default level, `WARN`.

use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

use crate::server::START_TARGET;
use crate::settings::Settings;

/// `LOG_LEVEL` as a filter.
pub fn level(settings: &Settings) -> LevelFilter {
    match settings.log_level.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        _ => LevelFilter::ERROR,
    }
}

/// Which events are written.
#[derive(Clone, Debug)]
pub struct LogFilter {
    level: LevelFilter,
    start: LevelFilter,
}

impl LogFilter {
    /// The filter `settings` ask for.
    pub fn new(settings: &Settings) -> LogFilter {
        let level = level(settings);
        LogFilter {
            level,
            start: if level >= LevelFilter::WARN {
                level.max(LevelFilter::INFO)
            } else {
                level
            },
        }
    }

    /// Whether an event of this target and level is written (before its
    /// fields are looked at).
    pub fn allows(&self, metadata: &Metadata<'_>) -> bool {
        let limit = if metadata.target() == START_TARGET {
            self.start
        } else {
            self.level
        };
        *metadata.level() <= limit
    }
}

impl<S: Subscriber> Layer<S> for LogFilter {
    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.allows(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.level.max(self.start))
    }
}

/// Installs the subscriber for the process.
pub fn init(settings: &Settings) {
    let filter = LogFilter::new(settings);
    let fmt = tracing_subscriber::fmt()
        .with_max_level(filter.level.max(filter.start))
        // Colours only on a terminal: a log file or collector gets text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if settings.log_json {
        fmt.json().finish().with(filter).init();
    } else {
        fmt.finish().with(filter).init();
    }
}
