//! The batcher: one task per store that takes the checks queued by callers
//! and decides when to send them, and how many at once.
//!
//! It drops the jobs whose caller has already given up (timed out or
//! cancelled: never evaluated, so never counted) and keeps at most
//! `in_flight` batches on the connection. While the connection is idle a
//! check goes out at once, alone. While batches are out, the next one is
//! held until it carries its share of the load ([`to_send`]): with two in
//! flight, Redis evaluates one batch while the client answers the other and
//! neither side sleeps between them, and the per-call costs stay amortised
//! over large batches.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use redis::aio::ConnectionLike;
use tokio::sync::{mpsc, Notify};

use super::batch::{execute, Job};
use super::Config;

/// Starts the batcher task of a store; it ends when every sender is gone.
pub(crate) fn spawn<C>(conn: C, cfg: Arc<Config>) -> mpsc::Sender<Job>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let (tx, rx) = mpsc::channel(cfg.batch.queue);
    tokio::spawn(run(rx, conn, cfg));
    tx
}

/// The batches on the wire, shared by the batcher and the tasks that send
/// them.
#[derive(Default)]
struct Wire {
    batches: AtomicUsize,
    jobs: AtomicUsize,
    /// Signalled when a batch comes back.
    done: Notify,
}

/// Keeps a batch counted on the wire until its call ends (or is dropped).
struct OnWire {
    wire: Arc<Wire>,
    jobs: usize,
}

impl OnWire {
    fn new(wire: &Arc<Wire>, jobs: usize) -> OnWire {
        wire.batches.fetch_add(1, Ordering::AcqRel);
        wire.jobs.fetch_add(jobs, Ordering::AcqRel);
        OnWire {
            wire: wire.clone(),
            jobs,
        }
    }
}

impl Drop for OnWire {
    fn drop(&mut self) {
        self.wire.jobs.fetch_sub(self.jobs, Ordering::AcqRel);
        self.wire.batches.fetch_sub(1, Ordering::AcqRel);
        self.wire.done.notify_one();
    }
}

/// How many of the `queued` checks to send now, with `on_wire` batches
/// holding `jobs_on_wire` checks already out; 0 to wait.
///
/// An idle connection sends at once (no added round trip). Otherwise a batch
/// goes out while others are on the wire only once it holds its share of the
/// load (everything outstanding over the batches allowed out): the checks
/// then travel as a few evenly sized batches, so Redis works on one while the
/// client answers another, instead of each batch waiting for the last (1 in
/// flight) or many small batches paying the per-call costs (no gate). A check
/// waits at most until a batch comes back, as with one batch in flight.
fn to_send(
    queued: usize,
    on_wire: usize,
    jobs_on_wire: usize,
    in_flight: usize,
    max: usize,
) -> usize {
    if queued == 0 || on_wire >= in_flight {
        return 0;
    }
    let share = (jobs_on_wire + queued).div_ceil(in_flight).clamp(1, max);
    if on_wire == 0 || queued >= share {
        queued.min(share)
    } else {
        0
    }
}

async fn run<C>(mut rx: mpsc::Receiver<Job>, conn: C, cfg: Arc<Config>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let max = cfg.batch.max;
    let wire = Arc::new(Wire::default());
    let mut buf: Vec<Job> = Vec::with_capacity(max);
    let mut open = true;
    loop {
        // Everything queued, up to a batch.
        while open && buf.len() < max {
            match rx.try_recv() {
                Ok(job) => buf.push(job),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        // A caller that gave up while queued is never evaluated.
        buf.retain(|j| !j.reply.is_closed());
        if !open && buf.is_empty() {
            return; // every store clone is gone; batches on the wire finish alone
        }
        // On a cluster nothing is held back: a batch waiting on a dead or
        // frozen master (until the timeout) must not hold back the checks
        // bound for the live ones.
        let n = if cfg.cluster {
            buf.len()
        } else {
            to_send(
                buf.len(),
                wire.batches.load(Ordering::Acquire),
                wire.jobs.load(Ordering::Acquire),
                cfg.batch.in_flight,
                max,
            )
        };
        if n > 0 {
            let rest = buf.split_off(n);
            let jobs = std::mem::replace(&mut buf, rest);
            send(&conn, &cfg, &wire, jobs);
            continue;
        }
        // Wait for a check (room permitting) or for a batch to come back.
        let done = wire.done.notified();
        let mut done = std::pin::pin!(done);
        std::future::poll_fn(|cx| {
            if done.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            if open && buf.len() < max {
                let room = max - buf.len();
                if let Poll::Ready(got) = rx.poll_recv_many(cx, &mut buf, room) {
                    open = got > 0;
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
        .await;
    }
}

/// Sends `jobs` as one script call per hash slot (one on a single server),
/// concurrently, order within a slot kept.
fn send<C>(conn: &C, cfg: &Arc<Config>, wire: &Arc<Wire>, mut jobs: Vec<Job>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if !cfg.cluster || jobs.iter().all(|j| j.slot == jobs[0].slot) {
        let (conn, cfg, on_wire) = (conn.clone(), cfg.clone(), OnWire::new(wire, jobs.len()));
        tokio::spawn(async move {
            execute(conn, cfg, jobs).await;
            drop(on_wire);
        });
        return;
    }
    jobs.sort_by_key(|j| j.slot);
    while !jobs.is_empty() {
        let slot = jobs[0].slot;
        let n = jobs.iter().take_while(|j| j.slot == slot).count();
        let rest = jobs.split_off(n);
        let group = std::mem::replace(&mut jobs, rest);
        let (conn, cfg) = (conn.clone(), cfg.clone());
        let on_wire = OnWire::new(wire, group.len());
        tokio::spawn(async move {
            execute(conn, cfg, group).await;
            drop(on_wire);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::to_send;

    #[test]
    fn batches_go_at_once_when_idle_and_at_their_share_when_not() {
        // (queued, batches out, checks out, in flight allowed, max batch) → sent
        let cases = [
            ((1, 0, 0, 2, 128), 1, "idle: a lone check goes at once"),
            ((64, 0, 0, 2, 128), 32, "idle: a crowd goes as two batches"),
            ((32, 1, 32, 2, 128), 32, "the second half follows at once"),
            ((1000, 0, 0, 2, 128), 128, "never more than a batch"),
            ((64, 0, 0, 1, 128), 64, "one in flight: everything queued"),
            ((10, 1, 32, 2, 128), 0, "32 out: 10 wait for their share"),
            ((31, 1, 32, 2, 128), 0, "32 out: 31 still wait"),
            (
                (60, 1, 40, 2, 128),
                50,
                "40 out, 60 queued: half of the 100",
            ),
            ((64, 2, 64, 2, 128), 0, "as many batches out as allowed"),
            ((5, 1, 10, 1, 128), 0, "one in flight, one out"),
            ((0, 0, 0, 2, 128), 0, "nothing queued"),
        ];
        for ((queued, out, jobs_out, in_flight, max), sent, why) in cases {
            assert_eq!(
                to_send(queued, out, jobs_out, in_flight, max),
                sent,
                "{why}"
            );
        }
    }
}
