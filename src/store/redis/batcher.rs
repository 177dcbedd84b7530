//! The batcher: one task per store that takes the checks queued by callers
//! and decides when to send them, and how many at once.
//!
//! It drops the jobs whose caller has already given up (timed out or
//! cancelled: never evaluated, so never counted) and keeps at most
//! `in_flight` batches on the connection. While the connection is idle what
//! is queued goes out at once (a lone check alone, a crowd split evenly over
//! the batches allowed out). While batches are out, the next one is
//! held until it carries its share of the load ([`to_send`]): with two in
//! flight, Redis evaluates one batch while the client answers the other and
//! neither side sleeps between them, and the per-call costs stay amortised
//! over large batches.

use std::future::Future as _;
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

/// The sizes of the batches to send now, in order, for `queued` checks while
/// `on_wire` batches holding `jobs_on_wire` checks are out (empty: wait).
///
/// An idle connection sends everything at once, split evenly over the
/// batches allowed out: no added round trip. Otherwise a batch goes out
/// while others are on the wire only once it holds its share of the load
/// (everything outstanding over the batches allowed out, rounded up): the
/// checks then travel as a few evenly sized batches, so Redis works on one
/// while the client answers another, instead of each batch waiting for the
/// last (one in flight) or many small batches paying the per-call costs (no
/// gate). A check that waits is sent when a batch comes back, at the latest
/// when the last one does: bounded by the store timeout.
fn to_send(
    queued: usize,
    on_wire: usize,
    jobs_on_wire: usize,
    in_flight: usize,
    max: usize,
) -> Vec<usize> {
    let mut sizes = Vec::new();
    if queued == 0 || on_wire >= in_flight {
        return sizes;
    }
    if on_wire == 0 {
        let mut left = queued;
        for slots in (1..=in_flight).rev() {
            let n = left.div_ceil(slots).min(max);
            if n == 0 {
                break;
            }
            sizes.push(n);
            left -= n;
        }
        return sizes;
    }
    // Rounded up: rounded down, a batch would leave one check behind, which
    // then starts a third group of batches, each smaller (measured: 64
    // callers settled into three batches of 21, a third of the throughput).
    let share = (jobs_on_wire + queued).div_ceil(in_flight).clamp(1, max);
    if queued >= share {
        sizes.push(share);
    }
    sizes
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
        let sizes = if cfg.cluster {
            if buf.is_empty() {
                Vec::new()
            } else {
                vec![buf.len()]
            }
        } else {
            to_send(
                buf.len(),
                wire.batches.load(Ordering::Acquire),
                wire.jobs.load(Ordering::Acquire),
                cfg.batch.in_flight,
                max,
            )
        };
        if !sizes.is_empty() {
            for n in sizes {
                let jobs: Vec<Job> = buf.drain(..n).collect();
                send(&conn, &cfg, &wire, jobs);
            }
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
/// each in a task of its own, order within a slot kept.
///
/// Batches on the wire at the same time may reach Redis in either order
/// (a runtime may run the task spawned last first): their checks were all
/// waiting at once, so either order is one in which they could have come,
/// and each check is decided against every check decided before it.
fn send<C>(conn: &C, cfg: &Arc<Config>, wire: &Arc<Wire>, mut jobs: Vec<Job>)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    jobs.sort_by_key(|j| j.slot); // stable: a slot's checks keep their order
    while !jobs.is_empty() {
        let slot = jobs[0].slot;
        let n = jobs.iter().take_while(|j| j.slot == slot).count();
        let group: Vec<Job> = jobs.drain(..n).collect();
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

    /// (queued, batches out, checks out, in flight allowed, max batch)
    type Load = (usize, usize, usize, usize, usize);

    #[test]
    fn batches_go_at_once_when_idle_and_at_their_share_when_not() {
        let cases: [(Load, &[usize], &str); 16] = [
            ((1, 0, 0, 2, 128), &[1], "idle: a lone check goes at once"),
            ((2, 0, 0, 2, 128), &[1, 1], "idle: two checks, two batches"),
            ((3, 0, 0, 2, 128), &[2, 1], "idle: an odd crowd goes whole"),
            (
                (64, 0, 0, 2, 128),
                &[32, 32],
                "idle: a crowd goes as two batches",
            ),
            ((65, 0, 0, 2, 128), &[33, 32], "idle: odd, all of it"),
            ((64, 0, 0, 3, 128), &[22, 21, 21], "idle: three in flight"),
            (
                (128, 0, 0, 1, 128),
                &[128],
                "one in flight: everything queued",
            ),
            ((128, 0, 0, 2, 50), &[50, 50], "never more than a batch"),
            ((10, 1, 32, 2, 128), &[], "32 out: 10 wait for their share"),
            ((31, 1, 32, 2, 128), &[], "32 out: 31 still wait"),
            ((32, 1, 32, 2, 128), &[32], "32 out: 32 go"),
            (
                (40, 1, 32, 2, 128),
                &[36],
                "32 out, 40 queued: half of the 72 go",
            ),
            ((32, 1, 33, 2, 128), &[], "an odd total: 32 wait for a 33rd"),
            (
                (22, 2, 43, 3, 128),
                &[22],
                "three in flight: the third batch",
            ),
            ((64, 2, 64, 2, 128), &[], "as many batches out as allowed"),
            ((0, 0, 0, 2, 128), &[], "nothing queued"),
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
