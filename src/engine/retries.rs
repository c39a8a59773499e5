//! The releases owed to nodes that could not be reached: one queue per
//! node, bounded, and the handle of the node's worker. The worker itself
//! (the task that retries them) is in [`crate::engine::release`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::task::JoinHandle;

use crate::trace;

/// The most releases (locks) one node's retry queue keeps. Past it, or past
/// [`MAX_QUEUED_KEYS_PER_NODE`], the lock whose keys expire first is
/// dropped: its keys then expire with their ttl, as they would without the
/// retry.
pub(crate) const MAX_QUEUED_PER_NODE: usize = 10_000;

/// The most keys, over all its locks, one node's retry queue keeps (ten
/// locks of [`crate::MAX_RESOURCES`] each, or ten thousand single locks).
const MAX_QUEUED_KEYS_PER_NODE: usize = 100_000;

/// The releases still owed to each node, and one worker task per node that
/// retries them: however many locks are released while a node is down, the
/// node gets one task and at most one batch of requests per pause.
///
/// An owed release is one lock: its token and all its keys, released by the
/// request that the release round sent ([`unlock::request`](crate::protocol::request::unlock::request)). It is
/// owed until the node answers it, or until its keys would have expired
/// anyway, or until the manager (with all its clones) is dropped.
///
/// The worker starts on the runtime of the release that first owed the node
/// something, so that its requests ride the same connection as that
/// runtime's earlier requests on the node (a `SET` still queued there runs
/// before the retried release). When that runtime shuts down while releases
/// are still owed, the worker goes on from the crate's own release runtime:
/// one thread, started on first need, that lives as long as the process
/// (see `release::fallback`). So a release owed from a runtime that ended (a
/// `block_on` per command, a test per runtime) is still retried.
#[derive(Debug)]
pub(crate) struct Retries {
    queues: Vec<Mutex<Queue>>,
}

#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// Token → the lock owed.
    pub(crate) owed: HashMap<String, Owed>,
    /// The keys of all the locks owed.
    pub(crate) keys: usize,
    pub(crate) worker: Option<JoinHandle<()>>,
}

/// One lock whose release a node is owed.
#[derive(Debug)]
pub(crate) struct Owed {
    pub(crate) keys: Arc<[String]>,
    /// The instant its keys expire anyway.
    pub(crate) expiry: Instant,
    /// Released without publishing (see [`scripts::UNLOCK`](crate::protocol::scripts::UNLOCK)).
    pub(crate) quiet: bool,
}

impl Queue {
    pub(crate) fn remove(&mut self, token: &str) {
        if let Some(owed) = self.owed.remove(token) {
            self.keys -= owed.keys.len();
        }
    }

    /// Drops what expired by `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        let mut keys = self.keys;
        self.owed.retain(|_, owed| {
            let keep = owed.expiry > now;
            if !keep {
                keys -= owed.keys.len();
            }
            keep
        });
        self.keys = keys;
    }
}

impl Retries {
    pub(crate) fn new(nodes: usize) -> Self {
        Retries {
            queues: (0..nodes).map(|_| Mutex::new(Queue::default())).collect(),
        }
    }

    pub(crate) fn queue(&self, index: usize) -> std::sync::MutexGuard<'_, Queue> {
        // Every change under it keeps `owed` and `keys` in step before
        // anything that can panic; a poisoned lock is still usable.
        self.queues[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many releases (locks) are owed, over all nodes.
    pub(crate) fn owed(&self) -> usize {
        (0..self.queues.len())
            .map(|i| self.queue(i).owed.len())
            .sum()
    }

    /// Owes node `index` the release of the lock `token` over `keys` until
    /// `key_expiry`, and makes sure the node's worker runs.
    ///
    /// `_label` names the node in the trace; `start` starts the node's
    /// worker (`None` when no runtime can run it), called when none is
    /// running, outside the queue's lock.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &self,
        index: usize,
        keys: &Arc<[String]>,
        token: &str,
        key_expiry: Instant,
        quiet: bool,
        _label: &str,
        start: impl FnOnce() -> Option<JoinHandle<()>>,
    ) {
        let mut queue = self.queue(index);
        // The same lock owed again (a later release of it): one entry, its
        // keys the union, its expiry the later, published unless both were
        // quiet.
        let (keys, key_expiry, quiet) = match queue.owed.get(token) {
            Some(old) => {
                let mut union: Vec<String> = old.keys.to_vec();
                union.extend(keys.iter().filter(|k| !old.keys.contains(k)).cloned());
                (union.into(), old.expiry.max(key_expiry), old.quiet && quiet)
            }
            None => (keys.clone(), key_expiry, quiet),
        };
        queue.remove(token);
        while !queue.owed.is_empty()
            && (queue.owed.len() >= MAX_QUEUED_PER_NODE
                || queue.keys + keys.len() > MAX_QUEUED_KEYS_PER_NODE)
        {
            let first = queue
                .owed
                .iter()
                .min_by_key(|(_, owed)| owed.expiry)
                .map(|(token, _)| token.clone());
            if let Some(first) = first {
                queue.remove(&first);
            }
        }
        queue.keys += keys.len();
        queue.owed.insert(
            token.to_owned(),
            Owed {
                keys,
                expiry: key_expiry,
                quiet,
            },
        );
        trace::debug!(
            node = _label,
            owed = queue.owed.len(),
            "release owed to an unreachable node"
        );
        // A worker that ended is replaced. One whose runtime shut down has
        // already moved itself to the release runtime ([`Worker`](crate::engine::release)).
        let idle = queue.worker.as_ref().is_none_or(JoinHandle::is_finished);
        // `start` runs without the queue's lock: a runtime that is shutting
        // down drops the spawned task at once, and the dropped worker takes
        // this lock to move itself to the release runtime (under the lock,
        // the thread deadlocked on itself and the shutdown hung).
        drop(queue);
        if !idle {
            return;
        }
        let Some(worker) = start() else {
            return;
        };
        let mut queue = self.queue(index);
        // A worker that moved itself to the release runtime meanwhile, or
        // that a racing call started, is kept; two racing calls may each
        // start one: both drain the same queue and end when nothing is owed.
        if queue.worker.as_ref().is_none_or(JoinHandle::is_finished) {
            queue.worker = Some(worker);
        }
    }
}
