//! The classic `is_action_allowed` demo: "may user-42 reply?" checked 20 times in a row.
//!
//! Run with `cargo run --example is_action_allowed`. Each line prints the
//! decision and the reply redis-cell's `CL.THROTTLE` gives for the same call:
//! `[limited, limit, remaining, retry_after, reset_after]`.

use std::time::Duration;

use tower_throttle::{Limiter, MemoryStore, Policy, StoreError};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = MemoryStore::new();

    println!("CL.THROTTLE user-42:reply 15 30 60  (GCRA: bursts of 16, then 30 a minute)");
    let cell = Limiter::new(
        store.clone(),
        Policy::cell(15, 30, Duration::from_secs(60))?,
    )
    .with_prefix("cell");
    run(&cell).await?;

    println!();
    println!("sliding log: 5 replies per 60 s (the classic ZSET log, exact)");
    let log =
        Limiter::new(store, Policy::sliding_log(5, Duration::from_secs(60))?).with_prefix("log");
    run(&log).await?;
    Ok(())
}

async fn run(limiter: &Limiter) -> Result<(), StoreError> {
    for i in 1..=20 {
        let d = limiter.check("user-42:reply").await?;
        println!(
            "{i:>2} {:<7} {:?}  remaining {:>2}  retry_after {:>9}  reset_after {:?}",
            if d.allowed { "allowed" } else { "denied" },
            d.to_cell_reply(),
            d.remaining,
            d.retry_after
                .map_or("-".into(), |r| format!("{:.3}s", r.as_secs_f64())),
            d.reset_after,
        );
    }
    Ok(())
}
