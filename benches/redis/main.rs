//! The Redis store side by side with raw `INCR` and redis-cell's native
//! `CL.THROTTLE`, on one private `redis-server` started on a free loopback
//! port, from one process over one connection.
//!
//! ```text
//! cargo bench --features redis --bench redis
//! REDIS_CELL_MODULE=/path/to/libredis_cell.so cargo bench --features redis --bench redis
//! ```
//!
//! Environment: `REDIS_CELL_MODULE` (load redis-cell and add `CL.THROTTLE`
//! rows), `BENCH_SECS` (seconds per cell, default 1.5), `BENCH_CALLERS`
//! (comma-separated, default `1,16,64,256`), `BENCH_FILTER` (run only the
//! rows whose name contains it), `BENCH_IN_FLIGHT` (batches on the wire, default the store's, 2), `BENCH_WORKERS` (tokio worker threads,
//! default 1: the server has the other core).
//!
//! Every caller has its own key and a policy that never denies (so every
//! check writes), except the "abusive" rows: 64 callers on one denied key,
//! with and without the local denial cache. For each cell: checks/s, p50 and
//! p99 latency, and the server CPU per check from `INFO commandstats`
//! (`usec` of the command / checks) and from `INFO cpu` (user + sys delta /
//! checks). Prints a markdown table.

#[path = "../../tests/support/redis.rs"]
mod redis_support;
mod report;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis_support::RedisServer;
use tower_throttle::store::redis::{RedisStore, DEFAULT_BATCHES_IN_FLIGHT};
use tower_throttle::store::Charge;
use tower_throttle::{Policy, Store};

use report::{pct, print_table, Cell};

#[derive(Clone)]
enum Op {
    Incr,
    Cell {
        denied: bool,
    },
    Check {
        store: Arc<RedisStore>,
        policy: Policy,
        hot: bool,
    },
    Acquire {
        store: Arc<RedisStore>,
        policy: Policy,
    },
}

struct Row {
    name: String,
    /// The command whose `INFO commandstats` time is the server's work.
    command: &'static str,
    op: Op,
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn info(con: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(con).unwrap()
}

/// The value after `prefix` on its line: the whole rest, or its `key=`
/// item when `key` is not empty.
fn field(text: &str, prefix: &str, key: &str) -> f64 {
    let Some(rest) = text.lines().find_map(|l| l.trim().strip_prefix(prefix)) else {
        return 0.0;
    };
    let value = if key.is_empty() {
        Some(rest)
    } else {
        rest.split(',')
            .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    value.and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn cpu(con: &mut redis::Connection) -> f64 {
    let t = info(con, "cpu");
    field(&t, "used_cpu_user:", "") + field(&t, "used_cpu_sys:", "")
}

/// `usec` and `calls` of `command` in `INFO commandstats`.
fn command_stats(con: &mut redis::Connection, command: &str) -> (f64, f64) {
    let t = info(con, "commandstats");
    let line = format!("cmdstat_{command}:");
    (field(&t, &line, "usec"), field(&t, &line, "calls"))
}

async fn one(op: &Op, conn: &mut ConnectionManager, key: &str) {
    match op {
        Op::Incr => {
            let _: i64 = redis::cmd("INCR").arg(key).query_async(conn).await.unwrap();
        }
        Op::Cell { denied } => {
            let mut cmd = redis::cmd("CL.THROTTLE");
            if *denied {
                cmd.arg("hot").arg(0).arg(1).arg(3600).arg(1);
            } else {
                cmd.arg(key).arg(999_999).arg(1_000).arg(1).arg(1);
            }
            let _: redis::Value = cmd.query_async(conn).await.unwrap();
        }
        Op::Check { store, policy, hot } => {
            let key = if *hot { "hot" } else { key };
            store
                .check(Charge::new(key.as_bytes(), policy, 1))
                .await
                .unwrap();
        }
        Op::Acquire { store, policy } => {
            let d = store
                .check(Charge::new(key.as_bytes(), policy, 1))
                .await
                .unwrap();
            if let Some(id) = d.permit {
                store.release(key.as_bytes(), policy, id).await.unwrap();
            }
        }
    }
}

/// Runs `op` from `callers` tasks for `secs`; returns every latency (ns).
async fn load(op: &Op, conn: &ConnectionManager, callers: usize, secs: f64) -> (u64, Vec<u64>) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (op, mut conn) = (op.clone(), conn.clone());
            tokio::spawn(async move {
                let key = format!("bench:{i}");
                let mut lat = Vec::with_capacity(1 << 14);
                // Bounded in time and in count.
                while lat.len() < 5_000_000 {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        break;
                    }
                    one(&op, &mut conn, &key).await;
                    lat.push(t0.elapsed().as_nanos() as u64);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    (all.len() as u64, all)
}

fn main() {
    let secs: f64 = env("BENCH_SECS", 1.5);
    let workers: usize = env("BENCH_WORKERS", 1);
    let filter: String = env("BENCH_FILTER", String::new());
    let callers: Vec<usize> = env("BENCH_CALLERS", "1,16,64,256".to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let module = std::env::var("REDIS_CELL_MODULE").ok();
    let mut args = Vec::new();
    if let Some(m) = &module {
        args.push("--loadmodule".to_string());
        args.push(m.clone());
    }
    let server = RedisServer::start_with_args(&args);
    let mut admin = server.conn();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_all()
        .build()
        .unwrap();
    let url = server.url();
    let batched = build(&rt, &url, true, 0);
    let single = build(&rt, &url, false, 0);
    let cached = build(&rt, &url, true, 4096);
    let conn = batched.connection().clone();
    let mut rows = rows(module.is_some(), &batched, &single, &cached);
    rows.retain(|r| r.name.contains(&filter));
    let cells = measure(&rt, &rows, &callers, &conn, &mut admin, secs);
    print_table(&cells);
}

/// A store on `url`, batching or not, with a deny cache of `cache` keys.
fn build(rt: &tokio::runtime::Runtime, url: &str, batching: bool, cache: usize) -> Arc<RedisStore> {
    let url = url.to_owned();
    let timeout = Duration::from_secs(5);
    rt.block_on(async move {
        Arc::new(
            RedisStore::builder()
                .prefix("b")
                .timeout(timeout)
                .batching(batching)
                .batches_in_flight(env("BENCH_IN_FLIGHT", DEFAULT_BATCHES_IN_FLIGHT))
                .deny_cache(cache)
                .connect(url)
                .await
                .unwrap(),
        )
    })
}

/// The rows to measure: raw commands, each algorithm, the abusive cases.
fn rows(
    module: bool,
    batched: &Arc<RedisStore>,
    single: &Arc<RedisStore>,
    cached: &Arc<RedisStore>,
) -> Vec<Row> {
    let w = Duration::from_secs(60);
    // 1000/s with a burst of a million: never denies within a run, and the
    // key's tat runs ahead of now, so the key persists (as a busy user's does).
    let open_gcra = Policy::cell(999_999, 1_000, Duration::from_secs(1)).unwrap();
    // The same at T = 333,333⅓ → 333,333 ns, not a whole number of µs
    // (before `gcra.lua` ran in ns throughout, it took scripts of its own).
    let ns_gcra = Policy::cell(999_999, 3_000, Duration::from_secs(1)).unwrap();
    let hot_gcra = Policy::cell(0, 1, Duration::from_secs(3600)).unwrap();
    let check = |name: &str, store: &Arc<RedisStore>, policy: Policy| Row {
        name: name.into(),
        command: "evalsha",
        op: Op::Check {
            store: store.clone(),
            policy,
            hot: false,
        },
    };
    let mut rows = vec![Row {
        name: "raw INCR".into(),
        command: "incr",
        op: Op::Incr,
    }];
    if module {
        rows.push(Row {
            name: "native CL.THROTTLE".into(),
            command: "cl.throttle",
            op: Op::Cell { denied: false },
        });
    }
    rows.extend([
        check("gcra (batched)", batched, open_gcra),
        check("gcra, T not whole µs (batched)", batched, ns_gcra),
        check("gcra (batching off)", single, open_gcra),
        check(
            "fixed_window",
            batched,
            Policy::fixed_window(1 << 40, w).unwrap(),
        ),
        check(
            "sliding_window",
            batched,
            Policy::sliding_window(10_000_000, Duration::from_secs(10)).unwrap(),
        ),
        check(
            "sliding_log",
            batched,
            // The Redis store caps logs at 10,000; no caller gets near it in 100 ms.
            Policy::sliding_log(10_000, Duration::from_millis(100)).unwrap(),
        ),
        Row {
            name: "concurrency (check + release)".into(),
            command: "evalsha",
            op: Op::Acquire {
                store: batched.clone(),
                policy: Policy::concurrency(1 << 30).unwrap(),
            },
        },
    ]);
    if module {
        rows.push(Row {
            name: "abusive: CL.THROTTLE, one denied key".into(),
            command: "cl.throttle",
            op: Op::Cell { denied: true },
        });
    }
    for (name, store) in [
        ("abusive: gcra, one denied key, no cache", batched),
        ("abusive: gcra, one denied key, deny cache", cached),
    ] {
        rows.push(Row {
            name: name.into(),
            command: "evalsha",
            op: Op::Check {
                store: store.clone(),
                policy: hot_gcra,
                hot: true,
            },
        });
    }
    rows
}

/// Each row at each number of callers (the abusive ones at 64 only):
/// warmed up, then measured on the client and on the server.
fn measure(
    rt: &tokio::runtime::Runtime,
    rows: &[Row],
    callers: &[usize],
    conn: &ConnectionManager,
    admin: &mut redis::Connection,
    secs: f64,
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for row in rows {
        for &n in callers {
            let n = if row.name.starts_with("abusive") {
                64
            } else {
                n
            };
            if row.name.starts_with("abusive") && cells.iter().any(|c: &Cell| c.name == row.name) {
                continue;
            }
            // Warm up (connections, scripts, keys), then measure.
            rt.block_on(load(&row.op, conn, n, 0.2));
            let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(admin).unwrap();
            let cpu0 = cpu(admin);
            let t0 = Instant::now();
            let (checks, mut lat) = rt.block_on(load(&row.op, conn, n, secs));
            let elapsed = t0.elapsed().as_secs_f64();
            let cpu1 = cpu(admin);
            let (usec, calls) = command_stats(admin, row.command);
            lat.sort_unstable();
            let cell = Cell {
                name: row.name.clone(),
                callers: n,
                rate: checks as f64 / elapsed,
                p50: pct(&lat, 0.50),
                p99: pct(&lat, 0.99),
                cmd_us: usec / checks as f64,
                cpu_us: (cpu1 - cpu0) * 1e6 / checks as f64,
                per_call: checks as f64 / calls.max(1.0),
            };
            eprintln!(
                "{:<45} {:>4} callers: {:>9.0} checks/s  p50 {:>7.1} µs  p99 {:>7.1} µs  server {:.2} µs/check (cmdstats) {:.2} (cpu), {:.1} checks/call",
                cell.name, n, cell.rate, cell.p50, cell.p99, cell.cmd_us, cell.cpu_us, cell.per_call
            );
            cells.push(cell);
        }
    }
    cells
}
