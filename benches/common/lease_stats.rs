//! What `benches/lease/` counts in each client process and adds up in the
//! parent: a bounded latency histogram, admissions and denials per fixed
//! window, the one-line report a child prints, `INFO` readings, and the
//! parent/child protocol (`ready`, `go`, one `result …` line).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Log-linear latency histogram in ns: 16 sub-buckets per power of two
/// (≤ 6.25% error), 1,024 counters whatever the number of checks.
#[derive(Clone)]
pub struct Hist(Vec<u64>);

impl Default for Hist {
    fn default() -> Self {
        Hist(vec![0; 1024])
    }
}

impl Hist {
    fn index(ns: u64) -> usize {
        if ns < 16 {
            return ns as usize;
        }
        let exp = 63 - ns.leading_zeros() as usize;
        (exp - 3) * 16 + ((ns >> (exp - 4)) & 15) as usize
    }

    /// The middle of bucket `i`, in ns.
    fn value(i: usize) -> f64 {
        if i < 16 {
            return i as f64;
        }
        let (exp, sub) = (i / 16 + 3, (i % 16) as u64);
        ((16 + sub) << (exp - 4)) as f64 + (1u64 << (exp - 4)) as f64 / 2.0
    }

    pub fn record(&mut self, d: Duration) {
        self.0[Self::index(d.as_nanos().min(u128::from(u64::MAX)) as u64)] += 1;
    }

    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }

    /// The `p` quantile (0..1), in µs.
    pub fn quantile_us(&self, p: f64) -> f64 {
        let total: u64 = self.0.iter().sum();
        let rank = ((total as f64 * p).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(i) / 1000.0;
            }
        }
        0.0
    }
}

/// One client process's run.
#[derive(Clone, Default)]
pub struct Tally {
    pub checks: u64,
    pub admitted: u64,
    pub denied: u64,
    /// Store errors (counted, neither admitted nor denied).
    pub errors: u64,
    /// Admissions whose check started after the window they count in ended.
    pub late: u64,
    /// Admissions whose window from `now + reset_after` differs from
    /// `charged_at_ns / window` (a cross-check of the derivation).
    pub mismatched: u64,
    /// From the start signal to the last check's answer.
    pub secs: f64,
    pub hist: Hist,
    /// Window index → (admitted, denied).
    pub windows: BTreeMap<u64, (u64, u64)>,
}

impl Tally {
    /// Adds `t`'s counts, latencies and windows to these.
    pub fn absorb(&mut self, t: &Tally) {
        self.checks += t.checks;
        self.admitted += t.admitted;
        self.denied += t.denied;
        self.errors += t.errors;
        self.late += t.late;
        self.mismatched += t.mismatched;
        self.hist.merge(&t.hist);
        for (k, (a, d)) in &t.windows {
            let e = self.windows.entry(*k).or_default();
            e.0 += a;
            e.1 += d;
        }
    }

    /// One line: `result k=v …`, with `hist=i:n;…` and `win=w:a:d;…`.
    pub fn to_line(&self) -> String {
        let mut s = format!(
            "result checks={} admitted={} denied={} errors={} late={} mismatched={} secs={} hist=",
            self.checks,
            self.admitted,
            self.denied,
            self.errors,
            self.late,
            self.mismatched,
            self.secs
        );
        for (i, n) in self.hist.0.iter().enumerate().filter(|(_, n)| **n > 0) {
            let _ = write!(s, "{i}:{n};");
        }
        s.push_str(" win=");
        for (w, (a, d)) in &self.windows {
            let _ = write!(s, "{w}:{a}:{d};");
        }
        s
    }

    pub fn from_line(line: &str) -> Option<Tally> {
        let mut t = Tally::default();
        for item in line.strip_prefix("result ")?.split(' ') {
            let (k, v) = item.split_once('=')?;
            let list = || v.split(';').filter(|e| !e.is_empty()).map(|e| e.split(':'));
            match k {
                "checks" => t.checks = v.parse().ok()?,
                "admitted" => t.admitted = v.parse().ok()?,
                "denied" => t.denied = v.parse().ok()?,
                "errors" => t.errors = v.parse().ok()?,
                "late" => t.late = v.parse().ok()?,
                "mismatched" => t.mismatched = v.parse().ok()?,
                "secs" => t.secs = v.parse().ok()?,
                "hist" => {
                    for mut e in list() {
                        let i: usize = e.next()?.parse().ok()?;
                        *t.hist.0.get_mut(i)? = e.next()?.parse().ok()?;
                    }
                }
                "win" => {
                    for mut e in list() {
                        let w = e.next()?.parse().ok()?;
                        let a = e.next()?.parse().ok()?;
                        t.windows.insert(w, (a, e.next()?.parse().ok()?));
                    }
                }
                _ => {}
            }
        }
        Some(t)
    }
}

/// Over a set of per-window counts against `limit`: the most admitted in a
/// window, the windows above the limit, the denials in windows that
/// admitted fewer than the limit (false denials), and the fewest admitted
/// in a window with a false denial.
#[derive(Default)]
pub struct Verdict {
    pub max: u64,
    pub over: u64,
    pub false_denials: u64,
    pub fewest_where_denied: Option<u64>,
}

impl Verdict {
    pub fn add(&mut self, windows: &BTreeMap<u64, (u64, u64)>, limit: u64) {
        for &(a, d) in windows.values() {
            self.max = self.max.max(a);
            self.over += u64::from(a > limit);
            if a < limit && d > 0 {
                self.false_denials += d;
                self.fewest_where_denied = Some(self.fewest_where_denied.map_or(a, |f| f.min(a)));
            }
        }
    }
}

/// Redis `INFO` readings from the parent's own connection.
pub struct ServerStats {
    /// Calls of every command (`INFO commandstats`).
    pub calls: f64,
    /// `used_cpu_user + used_cpu_sys`, in s.
    pub cpu: f64,
}

/// INFO calls [`ServerStats::read`] adds to the next reading's `calls`.
pub const OWN_CALLS_PER_READ: f64 = 2.0;

impl ServerStats {
    /// Reads `commandstats` first, then `cpu`: a reading counts neither of
    /// its own calls, the next one counts both.
    pub fn read(con: &mut redis::Connection) -> ServerStats {
        let stats: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
        let cpu: String = redis::cmd("INFO").arg("cpu").query(con).unwrap();
        let calls = stats
            .lines()
            .filter(|l| l.starts_with("cmdstat_"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .sum();
        let field = |name: &str| -> f64 {
            cpu.lines()
                .find_map(|l| l.trim().strip_prefix(name)?.parse().ok())
                .unwrap_or(0.0)
        };
        ServerStats {
            calls,
            cpu: field("used_cpu_user:") + field("used_cpu_sys:"),
        }
    }
}

/// Unix ns of an `Instant`, from one anchor taken at start.
#[derive(Clone, Copy)]
pub struct UnixClock(Instant, u64);

impl UnixClock {
    pub fn new() -> Self {
        let unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        UnixClock(Instant::now(), unix.as_nanos() as u64)
    }

    pub fn ns(&self, at: Instant) -> u64 {
        self.1 + at.duration_since(self.0).as_nanos() as u64
    }
}

/// `ready` on stdout, then waits for a line on stdin.
pub fn handshake() {
    println!("ready");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}

/// Spawns the `procs` children of one cell (this executable, in child
/// mode), starts them together once all are `ready`, and collects them.
/// Returns their tallies, and the Redis commands and server CPU (s) spent
/// from the start signal to the last exit.
pub fn cell(
    url: &str,
    procs: u32,
    admin: &mut redis::Connection,
    config: &str,
    phase: &str,
) -> (Vec<Tally>, f64, f64) {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..procs)
        .map(|i| {
            Command::new(&exe)
                .env("LEASE_BENCH_CHILD", format!("{config}:{phase}"))
                .env("LEASE_BENCH_URL", url)
                .env("LEASE_BENCH_INDEX", i.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("re-execute the bench as a child")
        })
        .collect();
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    let mut line = String::new();
    for out in &mut outs {
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "a child did not start");
    }
    let before = ServerStats::read(admin);
    for c in &mut children {
        writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
    }
    let tallies: Vec<Tally> = outs
        .iter_mut()
        .map(|out| {
            line.clear();
            out.read_line(&mut line).unwrap();
            Tally::from_line(line.trim()).unwrap_or_else(|| panic!("bad child line: {line}"))
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a child failed");
    }
    let after = ServerStats::read(admin);
    (
        tallies,
        after.calls - before.calls - OWN_CALLS_PER_READ,
        after.cpu - before.cpu,
    )
}
