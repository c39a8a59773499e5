//! The quorum round: one request per node, all sent at once, each bounded
//! by the connect and node timeouts, counted by the [`Tally`] until the
//! outcome is certain.
//!
//! When a round stops at a quorum, the requests still pending are finished
//! by a task of their own, or, for a round run outside a task, by the
//! manager's [finisher](crate::engine::finisher) task, so that slower
//! nodes get the write too; a lock on one resource keeps its acquisition's
//! instead, until its next round drives them
//! ([`Deferred`]). Anything that later touches the same key on a
//! node (a release, say) must come after
//! that node's pending request, or a late `SET` could land after the
//! release and leave the key behind for its whole ttl. [`InFlight`] tracks
//! which of a round's requests have settled, for that.
//!
//! # The time a request gets
//! The node timeout is the bound for a request over one key. A node runs a
//! script over many keys (a lock on several resources) in one go, in time
//! that grows with the keys, so a request naming `n` keys gets the node
//! timeout plus [`PER_KEY`](crate::protocol::request::PER_KEY) for each key past the first
//! ([`Request::timeout`]): about 1 s more for a lock on 1,000 resources
//! (its fencing scripts name each counter too, so about 2 s more). A request over
//! one key keeps the node timeout as it is. A node that does not answer
//! holds such a request up that much longer: a round that needs every node
//! (a release) waits for it, one that stops at a quorum does not.

use std::sync::Arc;
use std::task::Poll;

use futures::FutureExt;
use futures::stream::StreamExt;
use redis::Value;

use crate::engine::Inner;
pub(crate) use crate::engine::call::{Prepared, call};
use crate::engine::deferred::Deferred;
use crate::engine::fanout::Fanout;
use crate::engine::finisher::Leftover;
pub(crate) use crate::engine::inflight::InFlight;
use crate::engine::inflight::{Mark, SendUntil, Settled};
use crate::engine::send;
use crate::protocol::error::NodeError;
use crate::protocol::quorum::{Ask, Reply};
pub(crate) use crate::protocol::request::Request;
use crate::protocol::request::acquire;
use crate::protocol::tally::Tally;
#[cfg(feature = "tracing")]
use crate::trace;

/// The next outcome of a round's requests, polling the lock's kept
/// leftover meanwhile (`deferred`, see [`Deferred`]; let go of once it is
/// done or handed to a task); once `timer` fired, the requests on the
/// round's deadline that have no reply answer that they timed out. `None`
/// when none is left, or when the `unheard` requests are all that is left
/// and none of them is ready (each was polled, so sent, first).
async fn next<F: Future + Unpin>(
    pending: &mut Fanout<F>,
    mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    settled: &Settled,
    unheard: usize,
    deferred: &mut Option<&Deferred>,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        if let Some(kept) = deferred
            && !kept.drive(cx)
        {
            *deferred = None;
        }
        loop {
            let expired = settled.expired.load(std::sync::atomic::Ordering::Relaxed);
            // The requests first, the timer after: a reply that is there
            // when polled counts, however late the poll (a lock's kept
            // leftover is polled when the lock is next used).
            if let Poll::Ready(outcome) = pending.poll_next_unpin(cx) {
                return Poll::Ready(outcome);
            }
            if !expired && timer.as_mut().poll(cx).is_ready() {
                settled
                    .expired
                    .store(true, std::sync::atomic::Ordering::Release);
                // The requests on the deadline answer now.
                continue;
            }
            return match pending.len() <= unheard {
                true => Poll::Ready(None),
                false => Poll::Pending,
            };
        }
    })
    .await
}

/// A round's part in polling the lock's kept leftover ([`Deferred`]):
/// what is left of it when the round ends, or is dropped midway (its
/// caller cancelled), goes on in a task. A round that is neither polled
/// nor dropped holds nothing up: another round on the lock polls it too.
struct Polling<'a>(Option<&'a Deferred>);

impl Drop for Polling<'_> {
    fn drop(&mut self) {
        if let Some(kept) = self.0 {
            kept.finish();
        }
    }
}

/// Until when a round's requests may still be sent after a wait (a
/// connection being made, the node's earlier requests on the lock, a
/// second send): see [`Settled::may_send`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum SendBy {
    /// Any time: a late request does no harm (a release, a read, a
    /// fencing counter, which only grows).
    Any,
    /// The round's deadline, or the given instant (the keys' expiry) if
    /// that comes first; a first send that waited only for its connection,
    /// the connect timeout later ([`SendUntil`]): a request that writes
    /// the lock's keys. An acquisition's `SET`, or an
    /// extension that sets a key found missing again (its heal), sent
    /// later would set the key after the round decided without it: past
    /// the lock's validity, or after a release that gave up waiting for
    /// it (the wait for earlier requests is bounded).
    Deadline(Option<std::time::Instant>),
}

/// How long a round listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Until the outcome is certain: a quorum agreed, or the answers so far
    /// decide what the failure is ([`Tally::decided`]).
    Decided,
    /// Until every node answered (each still bounded by the timeouts).
    AllNodes,
    /// Until every node answered, but for the nodes that were silent when
    /// the round began ([`Silence`]: their last request timed out
    /// and nothing was heard from them since): once the others answered,
    /// and if the release is `Ok` without them
    /// ([`Tally::released_without`]), their requests, sent, are left to
    /// finish in the background, and they count as not answering
    /// ([`NodeError::Silent`]). A release, with a node paused or cut off,
    /// then does not wait the node timeout for it each time; where a
    /// silent node's answer decides the outcome, it is waited for.
    ///
    /// [`Silence`]: crate::engine::silence::Silence
    AllAnswering,
}

/// What a round returns: the tally, and its requests that may still run.
pub(crate) struct Round {
    pub(crate) tally: Tally,
    pub(crate) in_flight: InFlight,
}

/// Sends `request` to every node in `only` (all nodes when `None`) at once
/// and counts the answers, each read by `read`. Nodes left out are not asked
/// and count as not answering.
///
/// With [`Until::Decided`] the round returns as soon as the outcome is
/// certain. The requests still pending then are finished in the background
/// ([`Finishers::finish`](crate::engine::finisher::Finishers::finish)) when
/// the round reached a quorum, and dropped when it did not (the caller
/// releases everywhere next, after each node's request settled). Each
/// node's request waits first for that node's requests in `after`.
///
/// A round must be polled on one runtime: its timer, which the leftover
/// takes along, belongs to the runtime that first polled it.
///
/// # Cancel safety
/// Dropping the future drops the pending requests; a request already
/// written to a node's socket still runs there, before anything sent to
/// that node later on the same connection (a request sent on another
/// connection, after a runtime that owned this one shut down, say, may
/// overtake it).
pub(crate) async fn round<F>(
    inner: &Inner,
    only: Option<&[usize]>,
    ask: Ask,
    until: Until,
    request: Request,
    after: &InFlight,
    read: F,
) -> Round
where
    F: Fn(&Value) -> Result<Reply, String>,
{
    let (round, leftover) =
        round_keeping(inner, only, ask, until, request, after, SendBy::Any, read).await;
    if let Some(leftover) = leftover {
        inner.finishers.finish(leftover);
    }
    round
}

/// [`round`], giving back the requests still pending (the leftover)
/// instead of having them finished: an acquisition keeps its leftover
/// with the lock it grants ([`InFlight::keeping`]). The caller must see
/// that the leftover is finished (polled to its end): a later request on
/// a node waits for that node's pending request to settle.
///
/// `send_by` says until when a request may still be sent after a wait
/// ([`Settled::may_send`]).
///
/// # Cancel safety
/// As [`round`].
#[allow(clippy::too_many_arguments)]
pub(crate) async fn round_keeping<F>(
    inner: &Inner,
    only: Option<&[usize]>,
    ask: Ask,
    until: Until,
    request: Request,
    after: &InFlight,
    send_by: SendBy,
    read: F,
) -> (Round, Option<Leftover>)
where
    F: Fn(&Value) -> Result<Reply, String>,
{
    inner.warm_up().await;
    // The lock's kept leftover (its granting round's requests to the
    // slower nodes), polled with this round's requests: each node's
    // request here goes behind that node's there, and may wait for it to
    // settle. It stays with the lock: another round on it (or the last
    // copy's drop) polls it too.
    let mut deferred = Polling(after.deferred());
    if let Some(kept) = deferred.0 {
        // Polled once before anything else: a request of it whose deadline
        // passed (a lock held past the node timeout) times out now, and a
        // node that did not answer it counts as silent for this round.
        std::future::poll_fn(|cx| {
            if !kept.drive(cx) {
                deferred.0 = None;
            }
            Poll::Ready(())
        })
        .await;
    }
    let nodes = &inner.nodes;
    let node_timeout = inner.config.node_timeout;
    // A guarded acquisition's form for nodes known to be old, made once
    // for the round (it was a twelfth of a guarded cycle's client time
    // made per node).
    let prepared = Prepared {
        known_old: acquire::known_old(&request),
        // A script's `EVALSHA`, made once for every node (not for a round
        // of cluster nodes, which build their own per slot).
        evalsha: match nodes.iter().all(|node| node.is_cluster()) {
            true => None,
            false => send::prebuilt(&request),
        },
    };
    let timeout = request.timeout(node_timeout);
    // The round's one timer: every request sent at once is bounded by it
    // (a request that waited or was sent again has its own).
    // Checked: the builder takes any node timeout.
    let now = tokio::time::Instant::now();
    let deadline = now
        .checked_add(timeout)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(86_400 * 365 * 30));
    let send_until = match send_by {
        SendBy::Any => None,
        SendBy::Deadline(expiry) => {
            // The connection gate's bounded wait, then the attempt.
            let connected = crate::protocol::timing::after(
                deadline.into_std(),
                inner.config.connect_timeout.saturating_mul(2),
            );
            let sooner = |at: std::time::Instant| expiry.map_or(at, |e| e.min(at));
            Some(SendUntil {
                first: sooner(connected),
                again: sooner(deadline.into_std()),
            })
        }
    };
    let settled = Arc::new(Settled::new(nodes.len(), send_until, |index| {
        only.is_none_or(|only| only.contains(&index))
    }));
    let mut pending = Fanout::new(
        nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| only.is_none_or(|only| only.contains(index)))
            .map(|(index, node)| {
                let (node, request, after) = (node.clone(), request.clone(), after.clone());
                let prepared = prepared.clone();
                let mark = Mark {
                    settled: settled.clone(),
                    index,
                };
                // Boxed: the set holds a pointer, and the request's state is
                // never moved (moving each node's future into the set was a
                // tenth of a cycle's client time in `memcpy`). Mapped, not
                // wrapped in an async block: a block keeps its captures
                // beside the call's own state, which took the box past the
                // allocator's per-thread cache (see the test below).
                Box::pin(
                    call(node, index, request, timeout, after, Some(mark), prepared)
                        .map(move |outcome| (index, outcome)),
                )
            }),
    );

    // Boxed, so that a leftover can take it along: a timer dropped and
    // made anew for the leftover was one more registration with the
    // runtime's timer wheel, and one more removal, in most rounds.
    let mut timer = Box::pin(tokio::time::sleep_until(deadline));
    let mut tally = Tally::new(ask, nodes.len());
    // The silent nodes a release does not wait for, while their requests
    // are pending (empty, and not allocated, in every other round).
    let mut unheard: Vec<usize> = match until {
        Until::AllAnswering => nodes
            .iter()
            .enumerate()
            .filter(|(index, node)| {
                only.is_none_or(|only| only.contains(index)) && node.silence.is_silent()
            })
            .map(|(index, _)| index)
            .collect(),
        Until::Decided | Until::AllNodes => Vec::new(),
    };
    // The silent nodes are left out only once the release is `Ok` without
    // them: where their answer decides it, they are waited for.
    let skippable = |tally: &Tally, unheard: usize| match unheard {
        0 => 0,
        _ if tally.released_without(unheard) => unheard,
        _ => 0,
    };
    while let Some((index, outcome)) = next(
        &mut pending,
        timer.as_mut(),
        &settled,
        skippable(&tally, unheard.len()),
        &mut deferred.0,
    )
    .await
    {
        if let Some(at) = unheard.iter().position(|&silent| silent == index) {
            unheard.swap_remove(at);
        }
        // A failed request counted itself ([`call`]); a reply that makes
        // no sense is counted here.
        let answer = outcome.and_then(|value| {
            read(&value).map_err(|e| {
                nodes[index].failed();
                NodeError::UnexpectedReply(e)
            })
        });
        if let Err(_cause) = &answer {
            #[cfg(feature = "tracing")]
            trace::debug!(node = nodes[index].label(), cause = %_cause, "node did not agree");
        }
        tally.record(index, nodes[index].label(), answer);
        if until == Until::Decided && tally.decided() {
            break;
        }
    }
    // The silent nodes not heard from: not waited for (and not counted as
    // failures here: each request, left to finish, counts its own if it
    // fails).
    for index in unheard {
        tally.record(index, nodes[index].label(), Err(NodeError::Silent));
    }
    // What is left of the lock's kept leftover goes on in a task: this
    // round's requests left to finish may wait for it to settle.
    drop(deferred);
    let leftover =
        match (tally.quorum_at.is_some() || until == Until::AllAnswering) && !pending.is_empty() {
            true => {
                let settled_rest = settled.clone();
                // Each is bounded by the timeouts, so whoever finishes them (a
                // task of their own, the finisher, or a lock's next request)
                // is done with them soon. A node that fails every request but
                // is never among the first to answer still counts in
                // `node_failures`: each request counts its own failure
                // ([`call`]; the replies left here are not read, the round's
                // reader borrows).
                Some(Box::pin(async move {
                    let mut timer = timer;
                    while next(&mut pending, timer.as_mut(), &settled_rest, 0, &mut None)
                        .await
                        .is_some()
                    {}
                }) as Leftover)
            }
            false => None,
        };
    // A round that heard every node leaves nothing in flight.
    let round = Round {
        tally,
        in_flight: InFlight::of(settled),
    };
    (round, leftover)
}

#[cfg(test)]
mod tests {
    /// A node's request future, as a round boxes it once per node, stays
    /// under glibc's per-thread cache limit (1,032 bytes): a larger
    /// allocation takes the allocator's slow path, which also consolidates
    /// its fast bins (`malloc_consolidate` was 4 % of a cycle's client time
    /// when the future was 4 KiB; wrapped in an async block, it was 1,072
    /// bytes, and ten such allocations a cycle took that path).
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    #[test]
    fn a_node_request_future_fits_the_allocator_cache() {
        use futures::FutureExt;
        fn size<F: FnOnce() -> Fut, Fut>(_: F) -> usize {
            std::mem::size_of::<Fut>()
        }
        let boxed = size(|| {
            let index = 0;
            crate::engine::call::call(todo!(), index, todo!(), todo!(), todo!(), todo!(), todo!())
                .map(move |outcome| (index, outcome))
        });
        assert!(boxed <= 1032, "a node's request future is {boxed} bytes");
    }
}
