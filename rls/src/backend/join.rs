//! Running a request's store checks together.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;

/// Drives every future to its end, polling them in order (so a check
/// reaches its store, or its connection, in the order given), and returns
/// their outputs in that order.
pub(crate) async fn all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut running: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = running.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, out) in running.iter_mut().zip(done.iter_mut()) {
            if out.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn outputs_come_in_order_whatever_finishes_first() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let first = Box::pin(async move { rx.await.unwrap_or(0) });
        let second = Box::pin(async move {
            let _ = tx.send(7);
            8
        });
        let futures: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = u32>>>> =
            vec![first, second];
        assert_eq!(super::all(futures).await, vec![7, 8]);
    }
}
