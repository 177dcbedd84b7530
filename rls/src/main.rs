//! `throttle-rls`: settings from the environment, then serve until SIGTERM.

#![forbid(unsafe_code)]

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
    throttle_rls::logging::init(&settings);
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
