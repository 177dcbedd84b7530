//! The bench's cells and the markdown table they are printed as.

/// One row at one number of callers: what was measured.
pub struct Cell {
    pub name: String,
    pub callers: usize,
    pub rate: f64,
    pub p50: f64,
    pub p99: f64,
    pub cmd_us: f64,
    pub cpu_us: f64,
    /// Checks per call of the command (batch size for scripts).
    pub per_call: f64,
}

/// The `p` quantile of `sorted` latencies, in µs.
pub fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
    sorted[i] as f64 / 1000.0
}

/// The markdown table, with each rate against raw INCR and CL.THROTTLE.
pub fn print_table(cells: &[Cell]) {
    let rate_of = |name: &str, n: usize| {
        cells
            .iter()
            .find(|c| c.name == name && c.callers == n)
            .map(|c| c.rate)
    };
    println!();
    println!(
        "| check | callers | checks/s | p50 µs | p99 µs | × INCR | × CL.THROTTLE | server µs/check (commandstats) | server µs/check (INFO cpu) | checks per call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cells {
        let ratio =
            |base: Option<f64>| base.map_or("–".to_string(), |b| format!("{:.2}", c.rate / b));
        let cell_base = if c.name.starts_with("abusive") {
            rate_of("abusive: CL.THROTTLE, one denied key", c.callers)
        } else {
            rate_of("native CL.THROTTLE", c.callers)
        };
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {:.2} | {:.2} | {:.1} |",
            c.name,
            c.callers,
            c.rate,
            c.p50,
            c.p99,
            ratio(rate_of("raw INCR", c.callers)),
            ratio(cell_base),
            c.cmd_us,
            c.cpu_us,
            c.per_call
        );
    }
    if let (Some(on), Some(off)) = (
        rate_of("abusive: gcra, one denied key, deny cache", 64),
        rate_of("abusive: gcra, one denied key, no cache", 64),
    ) {
        println!(
            "\ndeny cache: {:.1}× the uncached checks/s on one denied key",
            on / off
        );
    }
}
