//! The bench's tables: every cell, each configuration's worst cell of its
//! repeats, and the targets.

use super::lease_stats::{Tally, Verdict};
use super::{env, limit_of};

/// One cell's figures.
pub(super) struct Row {
    pub(super) phase: String,
    pub(super) name: &'static str,
    pub(super) config: &'static str,
    pub(super) limit: u64,
    pub(super) rates: Vec<f64>,
    pub(super) all: Tally,
    pub(super) verdict: Verdict,
    /// Redis commands and server CPU (s) during the run (Redis configurations).
    pub(super) server: Option<(f64, f64)>,
}

/// Every cell, then the targets.
pub(super) fn print_table(rows: &[Row]) {
    println!(
        "\ncommit {}; {} processes × {} tasks, {} s per cell, {} tokio worker(s) per process; fixed window 1 s, limit 2^40 (open), {} (near, demand {}× the limit), {} (over); lease max_block {}\n",
        std::env::var("GIT_COMMIT").unwrap_or_else(|_| "(GIT_COMMIT unset)".into()),
        env("BENCH_PROCS", 4),
        env("BENCH_TASKS", 16),
        env("BENCH_SECS", 3.0),
        env("BENCH_WORKERS", 1),
        limit_of("near"),
        env("BENCH_DEMAND", 0.9),
        limit_of("over"),
        env("BENCH_MAX_BLOCK", 1024),
    );
    println!("| phase | configuration | checks/s per process (mean, min) | p50 µs | p99 µs | Redis commands / admitted check | server CPU µs / admitted check | max admitted in a window / limit | windows over limit | false denials (fewest admitted where denied) |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mean = |r: &Row| r.rates.iter().sum::<f64>() / r.rates.len().max(1) as f64;
    for r in rows {
        let min = r.rates.iter().copied().fold(f64::INFINITY, f64::min);
        let (cmds, cpu) = r.server.map_or(("–".into(), "–".into()), |(calls, cpu)| {
            let per = r.all.admitted.max(1) as f64;
            (
                format!("{:.4}", calls / per),
                format!("{:.3}", cpu * 1e6 / per),
            )
        });
        let scope = if r.config == "memory" {
            " (per process)"
        } else {
            ""
        };
        let fewest = r
            .verdict
            .fewest_where_denied
            .map_or(String::new(), |f| format!(" ({f})"));
        println!(
            "| {} | {} | {:.0}, {:.0} | {:.2} | {:.1} | {cmds} | {cpu} | {} / {}{scope} | {} | {}{fewest} |",
            r.phase,
            r.name,
            mean(r),
            min,
            r.all.hist.quantile_us(0.50),
            r.all.hist.quantile_us(0.99),
            r.verdict.max,
            r.limit,
            r.verdict.over,
            r.verdict.false_denials,
        );
    }
    // The target, from the rows measured.
    let find =
        |phase: &str, config: &str| rows.iter().find(|r| r.phase == phase && r.config == config);
    println!();
    // With BENCH_REPEAT, the i-th lease cell is paired with the i-th memory
    // cell (run next to it) and the median of the pairs' ratios is judged.
    let cells = |config: &str| -> Vec<&Row> {
        rows.iter()
            .filter(|r| r.phase == "open" && r.config == config)
            .collect()
    };
    let (leases, memory) = (cells("lease"), cells("memory"));
    if let (Some(lease), false) = (find("open", "lease"), memory.is_empty()) {
        let cmds = lease
            .server
            .map_or(f64::NAN, |(c, _)| c / lease.all.admitted.max(1) as f64);
        let mut ratios: Vec<f64> = leases
            .iter()
            .zip(&memory)
            .map(|(l, m)| mean(l) / mean(m))
            .collect();
        ratios.sort_by(f64::total_cmp);
        let ratio = ratios[ratios.len() / 2];
        let met = |ok: bool| if ok { "met" } else { "NOT met" };
        println!("target, open phase: leasing Redis commands per admitted check {cmds:.4} (≤ 0.05: {}); checks/s per process {ratio:.2}× the memory store's, median of {} pairs {ratios:.3?} (≥ 0.5: {})", met(cmds <= 0.05), ratios.len(), met(ratio >= 0.5));
    }
    let over: u64 = rows
        .iter()
        .filter(|r| r.config != "memory")
        .map(|r| r.verdict.over + r.all.late)
        .sum();
    println!("shared configurations: {over} windows over the limit or admissions served after their window ({})", if over == 0 { "limit held" } else { "LIMIT EXCEEDED" });
}

/// Per phase and configuration, the worst of its repeated cells: a
/// prefetch stall shows in one cell's p99 and commands per admission
/// while the medians look fine.
pub(super) fn print_worst(rows: &[Row]) {
    println!(
        "\nworst cell of {} per phase and configuration:\n",
        env("BENCH_REPEAT", 1)
    );
    println!("| phase | configuration | cells | lowest checks/s per process | highest p99 µs (median of cells) | most Redis commands / admitted check | windows over limit (all cells) |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for r in rows {
        if seen.contains(&(&r.phase, r.config)) {
            continue;
        }
        seen.push((&r.phase, r.config));
        let cells: Vec<&Row> = rows
            .iter()
            .filter(|c| c.phase == r.phase && c.config == r.config)
            .collect();
        let lowest = cells
            .iter()
            .flat_map(|c| c.rates.iter().copied())
            .fold(f64::INFINITY, f64::min);
        let mut p99: Vec<f64> = cells.iter().map(|c| c.all.hist.quantile_us(0.99)).collect();
        p99.sort_by(f64::total_cmp);
        let cmds = cells
            .iter()
            .filter_map(|c| {
                c.server
                    .map(|(calls, _)| calls / c.all.admitted.max(1) as f64)
            })
            .fold(None, |worst: Option<f64>, x| {
                Some(worst.map_or(x, |w| w.max(x)))
            })
            .map_or("–".to_string(), |w| format!("{w:.4}"));
        // Per process for the memory store, whose admissions may land after
        // their window's end here (the shared summary leaves it out too).
        let late = |c: &Row| if c.config == "memory" { 0 } else { c.all.late };
        let over: u64 = cells.iter().map(|c| c.verdict.over + late(c)).sum();
        println!(
            "| {} | {} | {} | {lowest:.0} | {:.1} ({:.1}) | {cmds} | {over} |",
            r.phase,
            r.name,
            cells.len(),
            p99.last().copied().unwrap_or(f64::NAN),
            p99[p99.len() / 2],
        );
    }
}
