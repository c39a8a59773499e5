//! Releasing a lock on every node: the ownership-checked release round, the
//! per-node queue that retries nodes that could not be reached, and the
//! guard that releases a cancelled attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::task::JoinHandle;

use crate::multi;
use crate::redlock::Inner;
use crate::round::{self, InFlight, Request, Until};
use crate::scripts;
use crate::tally::{Ask, Tally};
use crate::trace;

/// The most releases one node's retry queue keeps. Past it, the entry whose
/// key expires first is dropped: that key then expires with its ttl, as it
/// would without the retry.
pub(crate) const MAX_QUEUED_PER_NODE: usize = 10_000;
/// The most releases one retry sends to a node at once.
const BATCH: usize = 512;
/// The longest pause between two retries to a node.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Sends the ownership-checked release to every node, each after that
/// node's earlier requests on the lock (`after`) settled, and waits for all
/// of them (each bounded by the timeouts).
///
/// Nodes whose state is unknown afterwards may still hold the key (a SET
/// whose reply was lost with its connection, say), which would keep others
/// out until it expires: they go to the node's retry queue until
/// `key_expiry`.
///
/// `keys` are the keys of one lock (one, or the set of a lock on several
/// resources): each node deletes those that hold `token`, in one script.
pub(crate) async fn release_everywhere(
    inner: &Arc<Inner>,
    keys: &[&str],
    token: &str,
    key_expiry: Instant,
    after: &InFlight,
) -> Tally {
    release_on(inner, None, keys, token, key_expiry, after).await
}

/// [`release_everywhere`] on the nodes in `only` (all when `None`).
pub(crate) async fn release_on(
    inner: &Arc<Inner>,
    only: Option<&[usize]>,
    keys: &[&str],
    token: &str,
    key_expiry: Instant,
    after: &InFlight,
) -> Tally {
    release_with(inner, only, keys, token, key_expiry, after, false).await
}

/// [`release_on`], publishing the release unless `quiet`: a failed attempt
/// that never had a quorum, which no waiter took for a holder, is released
/// quietly (see [`scripts::UNLOCK`]).
pub(crate) async fn release_with(
    inner: &Arc<Inner>,
    only: Option<&[usize]>,
    keys: &[&str],
    token: &str,
    key_expiry: Instant,
    after: &InFlight,
    quiet: bool,
) -> Tally {
    let request = multi::unlock_request(keys, token, quiet);
    let round = round::round(
        inner,
        only,
        Ask::Owned,
        Until::AllNodes,
        request,
        after,
        scripts::read_unlock,
    )
    .await;
    if round.tally.highest == Some(2) {
        // A node named a successor: check that it took the lock.
        crate::wait::check_handoff(inner, &round.tally.agreed, keys, token);
    }
    if Instant::now() < key_expiry {
        // Owed key by key: the queue releases each with the single-key
        // script, which for a set does what the set's script does.
        for &index in &round.tally.unanswered {
            for key in keys {
                inner.retries.push(inner, index, key, token, key_expiry);
            }
        }
    }
    round.tally
}

/// The releases still owed to each node, and one worker task per node that
/// retries them: however many locks are released while a node is down, the
/// node gets one task and at most one batch of requests per pause.
#[derive(Debug)]
pub(crate) struct Retries {
    queues: Vec<Mutex<Queue>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// `(key, token)` → the instant the key expires anyway.
    owed: HashMap<(String, String), Instant>,
    worker: Option<JoinHandle<()>>,
}

impl Retries {
    pub(crate) fn new(nodes: usize) -> Self {
        Retries {
            queues: (0..nodes).map(|_| Mutex::new(Queue::default())).collect(),
        }
    }

    fn queue(&self, index: usize) -> std::sync::MutexGuard<'_, Queue> {
        // Every write under it is a single insert or remove; a panic cannot
        // leave it inconsistent.
        self.queues[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many releases are owed, over all nodes.
    pub(crate) fn owed(&self) -> usize {
        (0..self.queues.len())
            .map(|i| self.queue(i).owed.len())
            .sum()
    }

    /// Owes node `index` the release of `key` by `token` until `key_expiry`,
    /// and makes sure the node's worker runs.
    fn push(&self, inner: &Arc<Inner>, index: usize, key: &str, token: &str, key_expiry: Instant) {
        let mut queue = self.queue(index);
        if queue.owed.len() >= MAX_QUEUED_PER_NODE {
            let first = queue
                .owed
                .iter()
                .min_by_key(|(_, expiry)| **expiry)
                .map(|(k, _)| k.clone());
            if let Some(first) = first {
                queue.owed.remove(&first);
            }
        }
        queue
            .owed
            .insert((key.to_owned(), token.to_owned()), key_expiry);
        trace::debug!(
            node = inner.nodes[index].label(),
            owed = queue.owed.len(),
            "release owed to an unreachable node"
        );
        // A worker that died with its runtime is replaced.
        if queue.worker.as_ref().is_none_or(JoinHandle::is_finished)
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            queue.worker = Some(handle.spawn(drain(Arc::downgrade(inner), index)));
        }
    }
}

/// The worker of one node: retries what is owed to it, with a pause that
/// doubles from the node timeout up to one second while the node does not
/// answer, until nothing is owed, or every key has expired, or the manager
/// is dropped (it holds only a weak reference in between).
async fn drain(inner: Weak<Inner>, index: usize) {
    let mut pause = match inner.upgrade() {
        Some(inner) => inner.config.node_timeout,
        None => return,
    };
    loop {
        tokio::time::sleep(pause).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let batch: Vec<(String, String)> = {
            let mut queue = inner.retries.queue(index);
            let now = Instant::now();
            queue.owed.retain(|_, expiry| *expiry > now);
            if queue.owed.is_empty() {
                queue.worker = None;
                return;
            }
            queue.owed.keys().take(BATCH).cloned().collect()
        };
        let node = &inner.nodes[index];
        let node_timeout = inner.config.node_timeout;
        let answers = join_all(batch.iter().map(|(key, token)| {
            let request = Request::script(&scripts::UNLOCK, [key.as_bytes()], [token.as_bytes()]);
            round::call(
                node.clone(),
                index,
                request,
                node_timeout,
                InFlight::default(),
            )
        }))
        .await;
        let mut answered = 0;
        {
            let mut queue = inner.retries.queue(index);
            for (entry, answer) in batch.into_iter().zip(answers) {
                // Any answer but "no answer" settles it: released, not ours
                // any more, or an error that retrying will not fix.
                if !answer.is_err_and(|e| e.is_transient()) {
                    queue.owed.remove(&entry);
                    answered += 1;
                }
            }
        }
        trace::debug!(
            node = node.label(),
            answered,
            "release retry to an unreachable node"
        );
        pause = if answered > 0 {
            node_timeout
        } else {
            (pause * 2).min(MAX_PAUSE)
        };
    }
}

/// Releases an attempt from a spawned task when the attempt's future is
/// dropped before it was granted or released.
pub(crate) struct Cleanup {
    /// The manager, the attempt's keys and its token.
    pub(crate) inner: Option<(Arc<Inner>, Vec<String>, String)>,
    pub(crate) key_expiry: Instant,
}

impl Cleanup {
    pub(crate) fn disarm(&mut self) {
        self.inner = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some((inner, keys, token)) = self.inner.take() else {
            return;
        };
        // Drop must not block: hand the release to the runtime. Without a
        // runtime (the future was polled on one that is gone) the keys expire
        // with their ttl. Requests of the dropped round that were already
        // written to a socket run before this release on each node.
        let key_expiry = self.key_expiry;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                release_everywhere(&inner, &keys, &token, key_expiry, &InFlight::default()).await;
            });
        }
    }
}
