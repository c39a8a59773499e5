//! Releasing a lock on every node: the ownership-checked release round, the
//! per-node queue that retries nodes that could not be reached, and the
//! guard that releases a cancelled attempt.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use futures::future::join_all;
use tokio::task::JoinHandle;

use crate::engine::Inner;
use crate::engine::lock::Lock;
use crate::engine::round::{self, InFlight, Until};
use crate::protocol::error::Error;
use crate::protocol::quorum::Ask;
use crate::protocol::request::unlock;
use crate::protocol::tally::Tally;
use crate::protocol::timing;
use crate::trace::{self, InSpan};

/// The most releases (locks) one retry sends to a node at once.
const BATCH: usize = 512;
/// The most keys one retry sends to a node at once, over its locks (one lock
/// goes alone when it has more).
const BATCH_KEYS: usize = 1_024;

/// Sends the ownership-checked release to every node, each after that
/// node's earlier requests on the lock (`after`): queued behind them on
/// their connection, or once they settled (see
/// [`inflight`](crate::engine::inflight)). Waits for every node (each
/// bounded by the timeouts), but for nodes found silent before
/// ([`Until::AllAnswering`]): their requests go out and finish in the
/// background, and they are owed the release.
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
/// quietly (see [`scripts::UNLOCK`](crate::protocol::scripts::UNLOCK)).
pub(crate) async fn release_with(
    inner: &Arc<Inner>,
    only: Option<&[usize]>,
    keys: &[&str],
    token: &str,
    key_expiry: Instant,
    after: &InFlight,
    quiet: bool,
) -> Tally {
    let request = unlock::request(keys, token, quiet);
    let round = round::round(
        inner,
        only,
        Ask::Owned,
        Until::AllAnswering,
        request,
        after,
        unlock::read,
    )
    .await;
    if round.tally.highest == Some(2) {
        // A node named a successor: check that it took the lock.
        crate::engine::wait::handoff::check_handoff(inner, &round.tally.agreed, keys, token);
    }
    if !round.tally.unanswered.is_empty() && Instant::now() < key_expiry {
        // Owed lock by lock: the retry sends the same request again.
        let owed: Arc<[String]> = keys.iter().map(|&k| k.to_owned()).collect();
        for &index in &round.tally.unanswered {
            inner.retries.push(
                index,
                &owed,
                token,
                key_expiry,
                quiet,
                inner.nodes[index].label(),
                || start_worker(inner, index),
            );
        }
    }
    round.tally
}

impl Inner {
    pub(crate) async fn unlock(self: &Arc<Self>, lock: &Lock) -> Result<usize, Error> {
        let span = trace::span!("unlock", resource = %lock.label());
        let after = self.extensions.behind(&lock.token, &lock.in_flight);
        let tally =
            release_everywhere(self, &lock.key_list(), &lock.token, lock.key_expiry, &after)
                .in_span(span)
                .await;
        self.note(&tally);
        tally.into_released(&lock.label())
    }
}

/// Starts the worker of node `index` on the current runtime, or on the
/// release runtime ([`fallback`]) outside one.
fn start_worker(inner: &Arc<Inner>, index: usize) -> Option<JoinHandle<()>> {
    let handle = tokio::runtime::Handle::try_current()
        .ok()
        .or_else(fallback)?;
    Some(handle.spawn(drain(Worker::new(inner, index))))
}

/// The crate's own runtime for release workers whose runtime shut down: a
/// current-thread runtime on a thread of its own, started on first need and
/// kept for the life of the process (an idle thread parked in its driver).
/// `None` if it could not be started (the OS refused a thread, say): the
/// worker then ends, and the keys expire with their ttl.
fn fallback() -> Option<tokio::runtime::Handle> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            let handle = runtime.handle().clone();
            std::thread::Builder::new()
                .name("redlock-release".into())
                .spawn(move || runtime.block_on(std::future::pending::<()>()))
                .ok()?;
            Some(handle)
        })
        .clone()
}

/// A node's worker as its task holds it: when the task is dropped before the
/// worker ended (its runtime shut down), it starts again on the release
/// runtime ([`fallback`]) while the manager lives and something is owed.
struct Worker {
    inner: Weak<Inner>,
    index: usize,
    ended: bool,
}

impl Worker {
    fn new(inner: &Arc<Inner>, index: usize) -> Self {
        Worker {
            inner: Arc::downgrade(inner),
            index,
            ended: false,
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut queue = inner.retries.queue(self.index);
        queue.expire(Instant::now());
        if queue.owed.is_empty() {
            queue.worker = None;
            return;
        }
        // Never on the runtime that is shutting down (the current one, if
        // any): its tasks are being dropped.
        queue.worker = fallback().map(|runtime| {
            let moved = Worker::new(&inner, self.index);
            runtime.spawn(drain(moved))
        });
    }
}

/// The worker of one node: retries what is owed to it, with a pause that
/// doubles from the node timeout up to one second while the node does not
/// answer, until nothing is owed, or every key has expired, or the manager
/// is dropped (it holds only a weak reference in between).
async fn drain(mut worker: Worker) {
    let index = worker.index;
    let mut pause = match worker.inner.upgrade() {
        Some(inner) => inner.config.node_timeout,
        None => {
            worker.ended = true;
            return;
        }
    };
    loop {
        tokio::time::sleep(pause).await;
        let Some(inner) = worker.inner.upgrade() else {
            worker.ended = true;
            return;
        };
        let batch: Vec<(String, Arc<[String]>, bool)> = {
            let mut queue = inner.retries.queue(index);
            queue.expire(Instant::now());
            if queue.owed.is_empty() {
                queue.worker = None;
                worker.ended = true;
                return;
            }
            let mut keys = 0;
            queue
                .owed
                .iter()
                .take(BATCH)
                .take_while(|(_, owed)| {
                    let first = keys == 0;
                    keys += owed.keys.len();
                    first || keys <= BATCH_KEYS
                })
                .map(|(token, owed)| (token.clone(), owed.keys.clone(), owed.quiet))
                .collect()
        };
        let node = &inner.nodes[index];
        let node_timeout = inner.config.node_timeout;
        let answers = join_all(batch.iter().map(|(token, keys, quiet)| {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let request = unlock::request(&keys, token, *quiet);
            let timeout = request.timeout(node_timeout);
            round::call(
                node.clone(),
                index,
                request,
                timeout,
                InFlight::default(),
                None,
                round::Prepared::default(),
            )
        }))
        .await;
        let mut answered = 0;
        {
            let mut queue = inner.retries.queue(index);
            for ((token, _, _), answer) in batch.into_iter().zip(answers) {
                // Any answer but "no answer" settles it: released, not ours
                // any more, or an error that retrying will not fix.
                if !answer.is_err_and(|e| e.is_transient()) {
                    queue.remove(&token);
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
            timing::next_backoff(pause)
        };
    }
}

/// Releases an attempt from a spawned task when the attempt's future is
/// dropped before it was granted or released. It borrows what it needs
/// from the attempt and copies it only then: an attempt that ends (nearly
/// all) pays no copy of its keys and token, and no reference count on the
/// manager, which every worker thread shares.
pub(crate) struct Cleanup<'a> {
    /// The manager, the attempt's keys and its token, while armed.
    pub(crate) armed: Option<(&'a Arc<Inner>, &'a [String], &'a str)>,
    pub(crate) key_expiry: Instant,
}

impl<'a> Cleanup<'a> {
    /// Armed for the attempt of `keys` and `token` on `inner`'s nodes.
    pub(crate) fn new(
        inner: &'a Arc<Inner>,
        keys: &'a [String],
        token: &'a str,
        key_expiry: Instant,
    ) -> Self {
        Cleanup {
            armed: Some((inner, keys, token)),
            key_expiry,
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let Some((inner, keys, token)) = self.armed.take() else {
            return;
        };
        let (inner, keys, token) = (inner.clone(), keys.to_vec(), token.to_owned());
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
