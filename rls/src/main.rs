//! `throttle-rls`: settings from the environment, then serve until SIGTERM.

use std::process::ExitCode;

use throttle_rls::settings::Settings;

fn main() -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("throttle-rls: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&settings);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("throttle-rls: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(throttle_rls::server::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("throttle-rls: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `LOG_LEVEL` and `LOG_FORMAT`, as upstream names them.
fn init_logging(settings: &Settings) {
    use tracing_subscriber::filter::LevelFilter;
    let level = match settings.log_level.to_ascii_lowercase().as_str() {
        "trace" => LevelFilter::TRACE,
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" | "warning" => LevelFilter::WARN,
        _ => LevelFilter::ERROR,
    };
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    if settings.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
}
