//! The fan-out of a round: one request per node, polled together, their
//! outcomes taken in the order they come.
//!
//! A round has one request per node, a handful. `FuturesUnordered` keeps a
//! task cell per future (an allocation, reference counts and a wake-up
//! queue) so that it polls only the futures that woke: the right trade for
//! many futures, and a tenth of a lock+unlock cycle's client time for five
//! (scenario 5's profile, docs/performance.md). [`Fanout`] polls every
//! pending request on each wake-up instead: a request that did not wake
//! answers its poll at once, and five of them cost less than that
//! bookkeeping.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// Futures polled together; a [`Stream`] of their outputs, in the order
/// they complete. Each future is dropped as soon as it completes. They are
/// `Unpin` (boxed, for a request): the set moves them as it shrinks.
pub(crate) struct Fanout<F> {
    pending: Vec<F>,
}

impl<F: Future + Unpin> Fanout<F> {
    /// The futures of `futures`, not polled yet.
    pub(crate) fn new(futures: impl IntoIterator<Item = F>) -> Self {
        Fanout {
            pending: futures.into_iter().collect(),
        }
    }

    /// Whether every future has completed.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// How many futures have not completed.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }
}

impl<F: Future + Unpin> Stream for Fanout<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let pending = &mut self.get_mut().pending;
        if pending.is_empty() {
            return Poll::Ready(None);
        }
        for i in 0..pending.len() {
            if let Poll::Ready(output) = Pin::new(&mut pending[i]).poll(cx) {
                pending.swap_remove(i);
                return Poll::Ready(Some(output));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn outputs_come_in_the_order_the_futures_complete() {
        let delays = [30u64, 10, 20, 0];
        let mut fanout = Fanout::new(delays.iter().map(|&ms| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                ms
            })
        }));
        let mut seen = Vec::new();
        while let Some(ms) = fanout.next().await {
            seen.push(ms);
        }
        assert_eq!(seen, [0, 10, 20, 30]);
        assert!(fanout.is_empty());
        assert_eq!(fanout.next().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_rest_can_be_finished_elsewhere() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut fanout = Fanout::new((1..=5u64).map(|ms| {
            let tx = tx.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                tx.send(ms).unwrap();
            })
        }));
        drop(tx);
        for _ in 0..3 {
            fanout.next().await;
        }
        assert!(!fanout.is_empty());
        tokio::spawn(async move { while fanout.next().await.is_some() {} });
        let mut all = Vec::new();
        while let Some(ms) = rx.recv().await {
            all.push(ms);
        }
        assert_eq!(all, [1, 2, 3, 4, 5]);
    }
}
