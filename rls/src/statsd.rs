//! Statsd (`USE_STATSD`, upstream's default): every `STATS_FLUSH_INTERVAL`
//! the counters that moved are sent to `STATSD_HOST:STATSD_PORT` as
//! `<name>:<increase>|c` lines, under upstream's names
//! ([`Metrics::statsd_counters`]), over TCP (the default of upstream's
//! statsd library, lyft/gostats; `STATSD_PROTOCOL=udp` for UDP, in
//! datagrams of at most 1,432 bytes as gostats sends them).
//!
//! A statsd that cannot be reached loses those increases (as upstream's
//! sink drops what it cannot send), and is logged once when it stops
//! answering and once when it answers again.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use crate::metrics::Metrics;
use crate::settings::Statsd;

/// gostats' UDP buffer: no datagram is fragmented on a 1,500-byte MTU.
pub const MAX_DATAGRAM: usize = 1_432;

const CONNECT_TIMEOUT: Duration = Duration::from_millis(1_500);
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The increases since the last flush, as statsd lines.
#[derive(Default)]
pub struct Deltas {
    last: HashMap<String, u64>,
}

impl Deltas {
    /// `name:increase|c\n` for every counter that grew since the last call.
    pub fn lines(&mut self, metrics: &Metrics) -> Vec<String> {
        let mut out = Vec::new();
        for (name, total) in metrics.statsd_counters() {
            let last = self.last.get(&name).copied().unwrap_or(0);
            if total > last {
                out.push(format!("{name}:{}|c\n", total - last));
                self.last.insert(name, total);
            }
        }
        out
    }
}

/// Where lines go.
enum Sink {
    Udp(Option<UdpSocket>),
    Tcp(Option<TcpStream>),
}

impl Sink {
    async fn send(&mut self, addr: &str, lines: &[String]) -> io::Result<()> {
        match self {
            Sink::Udp(socket) => {
                if socket.is_none() {
                    let target = tokio::net::lookup_host(addr)
                        .await?
                        .next()
                        .ok_or_else(|| io::Error::other("no address"))?;
                    let local = if target.is_ipv4() {
                        "0.0.0.0:0"
                    } else {
                        "[::]:0"
                    };
                    let s = UdpSocket::bind(local).await?;
                    s.connect(target).await?;
                    *socket = Some(s);
                }
                let Some(s) = socket.as_ref() else {
                    return Ok(());
                };
                for datagram in datagrams(lines) {
                    if let Err(e) = s.send(datagram.as_bytes()).await {
                        *socket = None;
                        return Err(e);
                    }
                }
                Ok(())
            }
            Sink::Tcp(stream) => {
                if stream.is_none() {
                    let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
                        .await
                        .map_err(|_| {
                            io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
                        })??;
                    let _ = s.set_nodelay(true);
                    *stream = Some(s);
                }
                let Some(s) = stream.as_mut() else {
                    return Ok(());
                };
                let all = lines.concat();
                let written =
                    tokio::time::timeout(WRITE_TIMEOUT, s.write_all(all.as_bytes())).await;
                match written {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => {
                        *stream = None;
                        Err(e)
                    }
                    Err(_) => {
                        *stream = None;
                        Err(io::Error::new(io::ErrorKind::TimedOut, "write timed out"))
                    }
                }
            }
        }
    }
}

/// Lines packed into datagrams of at most [`MAX_DATAGRAM`] bytes (a longer
/// line goes alone).
pub fn datagrams(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current = String::new();
    for line in lines {
        if !current.is_empty() && current.len() + line.len() > MAX_DATAGRAM {
            out.push(std::mem::take(&mut current));
        }
        current.push_str(line);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Flushes every `settings.flush_interval`, forever.
pub async fn run(settings: Statsd, metrics: Arc<Metrics>) {
    let addr = if settings.host.contains(':') && !settings.host.starts_with('[') {
        format!("[{}]:{}", settings.host, settings.port)
    } else {
        format!("{}:{}", settings.host, settings.port)
    };
    let mut sink = if settings.tcp {
        Sink::Tcp(None)
    } else {
        Sink::Udp(None)
    };
    let mut deltas = Deltas::default();
    let mut tick = tokio::time::interval(settings.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut failing = false;
    loop {
        tick.tick().await;
        let lines = deltas.lines(&metrics);
        if lines.is_empty() {
            continue;
        }
        match sink.send(&addr, &lines).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(%addr, "statsd answers again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(%addr, error = %e,
                    "cannot send stats to statsd: they are dropped until it answers");
            }
            Err(_) => {}
        }
    }
}
