//! In-flight tracking: which requests of earlier rounds on a lock may still
//! be running, per node, so that a later request to a node (a release, an
//! extension) goes after them (see [`crate::engine::round`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Which requests of one round have settled, per node. Light on purpose:
/// a guard keeps one for its latest renewal.
#[derive(Debug)]
pub(crate) struct Settled {
    pub(crate) done: Box<[AtomicBool]>,
    pub(crate) changed: Notify,
}

impl Settled {
    pub(crate) fn all(&self) -> bool {
        self.done.iter().all(|d| d.load(Ordering::Acquire))
    }
}

/// Marks one node's request of a round settled when dropped: when it
/// completed, and also when it was dropped unfinished (see
/// [`InFlight::settled`]).
pub(crate) struct Mark {
    pub(crate) settled: Arc<Settled>,
    pub(crate) index: usize,
}

impl Drop for Mark {
    fn drop(&mut self) {
        self.settled.done[self.index].store(true, Ordering::Release);
        self.settled.changed.notify_waiters();
    }
}

/// Which requests of earlier rounds on a lock may still be running, per
/// node. A clone shares the same view: it is what each node's request of a
/// round takes, so it costs a reference count, and nothing when empty.
#[derive(Clone, Default)]
pub(crate) struct InFlight {
    rounds: Option<Arc<[Arc<Settled>]>>,
}

impl InFlight {
    /// Waits until every earlier request to node `index` has settled:
    /// answered, timed out, or dropped unfinished. A request that was dropped
    /// after it was written to the socket still runs on the node, but before
    /// anything sent to that node later, on the same connection.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub(crate) async fn settled(&self, index: usize) {
        for round in self.rounds() {
            let Some(done) = round.done.get(index) else {
                continue;
            };
            if done.load(Ordering::Acquire) {
                continue;
            }
            loop {
                // Register before looking, so that a mark in between is not
                // missed.
                let changed = round.changed.notified();
                let mut changed = std::pin::pin!(changed);
                changed.as_mut().enable();
                if done.load(Ordering::Acquire) {
                    break;
                }
                changed.await;
            }
        }
    }

    /// The requests of one round that may still run (none when `settled`
    /// says every node's request settled).
    pub(crate) fn of(settled: Arc<Settled>) -> InFlight {
        if settled.all() {
            return InFlight::default();
        }
        InFlight {
            rounds: Some(Arc::from([settled])),
        }
    }

    fn rounds(&self) -> &[Arc<Settled>] {
        self.rounds.as_deref().unwrap_or(&[])
    }

    /// These rounds followed by `later`, without the rounds that have
    /// settled on every node.
    pub(crate) fn and(&self, later: &InFlight) -> InFlight {
        let rounds: Vec<Arc<Settled>> = self
            .rounds()
            .iter()
            .chain(later.rounds())
            .filter(|round| !round.all())
            .cloned()
            .collect();
        InFlight {
            rounds: (!rounds.is_empty()).then(|| rounds.into()),
        }
    }
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("rounds", &self.rounds().len())
            .finish()
    }
}
