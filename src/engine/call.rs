//! One request to one node ([`call`]): after the node's earlier requests
//! on the same lock, bounded by the round's timer or its own, sent again on
//! a fresh connection when the node restarted, and the per-node fallbacks
//! (the script for servers older than Redis 7.0, the native conditional
//! delete for users denied scripts, the guarded acquisition's pipeline
//! for nodes known to be old).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::Either;
use redis::{Cmd, Value};

use crate::engine::inflight::{InFlight, Mark};
use crate::engine::node::{Node, NodeConn};
use crate::engine::send::run;
use crate::protocol::error::NodeError;
use crate::protocol::request::unlock;
use crate::protocol::request::{Marked, Request, acquire};

/// Sends `request` to one node: after the node's earlier requests on the
/// same lock (`after`), queued behind them on their connection or once they
/// settled (see [`inflight`](crate::engine::inflight)), connects within the
/// connect timeout, and waits for the reply within `timeout` (the node
/// timeout plus [`PER_KEY`](crate::protocol::request::PER_KEY) for each
/// key past the first: [`Request::timeout`], which the caller works out,
/// once for a round). A request on a connection that turns
/// out to be broken (the node restarted since it was made) is sent once more
/// on a fresh one. `mark`, when given, records where the request went, for
/// the requests that come after it; the request's future owns it, so that
/// the request counts as settled when the future completes or is dropped.
///
/// `prepared` is what the round made once for all its nodes.
///
/// A round's request (one with a `mark`) that fails counts in its node's
/// failures ([`Node::failed`]), whether its round still listened or left
/// it to finish in the background: the count needs nothing of the
/// manager's.
pub(crate) async fn call(
    node: Arc<Node>,
    index: usize,
    request: Request,
    timeout: Duration,
    after: InFlight,
    mark: Option<Mark>,
    prepared: Prepared,
) -> Result<Value, NodeError> {
    let Prepared { known_old, evalsha } = prepared;
    let mark = mark.as_ref();
    // A failure, counted where this is a round's request.
    let failed = |error: NodeError| {
        if mark.is_some() {
            node.failed();
        }
        error
    };
    // Whether earlier requests to the node may still run: this one then
    // goes after them (queued behind them, or once they settled).
    let mut behind = !after.settled_now(index);
    let mut sends = 0u32;
    let mut retried = false;
    // Whether it waited for the node's earlier requests to settle.
    let mut waited = false;
    let mut request = request;
    // The round's `EVALSHA`, while `request` is the round's script.
    let mut evalsha = evalsha;
    let mut compat = false;
    if node.old_set()
        && let Some(instead) = request.compat()
    {
        request = instead;
        compat = true;
    }
    let marked = request.marked();
    let mut known = match marked {
        Marked::Known => node.known.get(),
        Marked::WithAge | Marked::No => None,
    };
    // A guarded acquisition on a node known to be old: a pipeline, not
    // the script (see `acquire::known_old`).
    // (Not on a cluster node: the pipeline names the marker and the
    // lock key in two slots.)
    let mut checked = match (&known, known_old) {
        (Some(_), Some(old)) if !compat && !node.is_cluster() => Some(old),
        (Some(_), None) if !compat && !node.is_cluster() => acquire::known_old(&request),
        _ => None,
    };
    // Queued behind the earlier requests: on which connection, and which
    // of them had not settled then.
    let mut queued: Option<(u64, u64)> = None;
    // The answer to a send that went before an earlier request's second send.
    let mut earlier: Option<Value> = None;
    // The guarded pipeline's `SET` took and the marker had changed: our
    // key is to be taken back should the script that follows fail (a flag:
    // the release is made only then, and this future stays small).
    let mut take_back = false;
    loop {
        if sends > 0
            && let Some(mark) = mark
        {
            // To be sent again: a later request waits until this one
            // settled, from now on (a kept leftover whose request is
            // connecting again is not in its connection's queue).
            mark.sent(None);
        }
        if queued.take().is_some() {
            // Sent again: after the earlier requests settled.
            earlier_settled(&node, &after, index, timeout).await?;
        }
        // On the round's deadline: the first send, made at once (no
        // connection to make, nothing to wait for).
        let mut on_deadline = sends == 0 && mark.is_some();
        let mut conn = match node.connection_now() {
            Some(conn) => conn.map_err(failed)?,
            None => {
                on_deadline = false;
                node.connection().await.map_err(failed)?
            }
        };
        if std::mem::take(&mut behind) {
            match after.queued_on(index, conn.epoch) {
                Some(unsettled) if !node.is_cluster() => queued = Some((conn.epoch, unsettled)),
                _ => {
                    on_deadline = false;
                    waited = true;
                    earlier_settled(&node, &after, index, timeout).await?;
                    conn = node.connection().await.map_err(failed)?;
                }
            }
        }
        // A send again on a fresh connection, after a broken one, has the
        // first send's bound: the first never reached the node.
        let again = waited || (sends > 0 && !(retried && sends == 1));
        if !on_deadline && !may_send(mark, again) {
            // A wait (a connection being made, a second send) took it past
            // what a request that writes the lock's keys may still send (its
            // round's deadline, its keys' expiry): it counts as timed out.
            if std::mem::take(&mut take_back)
                && let Some(back) = acquire::taken_back(&request)
            {
                // The guarded pipeline's `SET` took: taken back, as below.
                Box::pin(take_back_key(&node, &back, timeout, &mut conn.conn)).await;
            }
            return Err(failed(NodeError::Timeout));
        }
        let sending = checked.as_ref().unwrap_or(&request);
        let once = sends == 0 && !node.is_cluster() && sending.sent_once();
        if let (Some(mark), false) = (mark, once) {
            mark.sent(None);
        }
        sends += 1;
        let epoch = conn.epoch;
        let outcome = {
            // Unconstrained: Tokio's cooperative budget could otherwise
            // turn the first poll away before the request takes its place
            // in the connection's queue.
            // Boxed (about 400 bytes): inline, it made each node's future
            // too large for the allocator's per-thread cache.
            let prebuilt = match checked {
                None => evalsha.as_deref(),
                Some(_) => None,
            };
            let sent = Box::pin(tokio::task::unconstrained(run(
                sending,
                known.as_deref(),
                &mut conn.conn,
                prebuilt,
            )));
            let sent = match mark {
                // The round's one timer bounds it (a timer per request was
                // a twentieth of a cycle's client time).
                Some(mark) if on_deadline => Either::Left(Expiring {
                    sent,
                    expired: &mark.settled.expired,
                }),
                _ => Either::Right(tokio::time::timeout(timeout, sent).map(Result::ok)),
            };
            let mut sent = std::pin::pin!(sent);
            // Polled once, the request is in the connection's queue (there
            // is always room in it, see `node::QUEUE_ROOM`, and nothing
            // before it in redis-rs waits): later requests queue behind it.
            let first = futures::poll!(sent.as_mut());
            if let (Some(mark), true) = (mark, once) {
                mark.sent(Some(epoch));
            }
            match first {
                std::task::Poll::Ready(outcome) => outcome,
                std::task::Poll::Pending => sent.await,
            }
        };
        if let Some((epoch, unsettled)) = queued
            && outcome.as_ref().is_some_and(|o| o.is_ok())
        {
            // Answered behind the earlier requests: it stands unless one of
            // them was sent again after it. Past the wait's bound it stands
            // too, if none was sent again so far: one that writes the lock's
            // keys is past its cutoff by then, and is not sent again
            // ([`Settled::may_send`]).
            let waited = earlier_settled(&node, &after, index, timeout).await;
            if !after.still_behind(index, epoch, unsettled) {
                waited?;
                if let Some(Ok(value)) = outcome {
                    earlier = Some(value);
                }
                continue;
            }
            queued = None;
        }
        match outcome {
            None => {
                node.timed_out(&conn);
                return Err(failed(NodeError::Timeout));
            }
            Some(Ok(value)) if checked.is_some() => {
                let was = known.as_deref().unwrap_or_default();
                // The node answered (a node flagged silent is heard).
                node.answered();
                match acquire::read_known_old(value, was) {
                    Ok(Ok(short)) => return Ok(short),
                    Ok(Err(value)) => {
                        // The marker changed: the script reads its age.
                        take_back = acquire::set_took(&request, &value);
                        node.known.forget();
                        known = None;
                        checked = None;
                        continue;
                    }
                    Err(e) => return Err(failed(NodeError::from_redis(e))),
                }
            }
            Some(Ok(value)) => {
                // Sent once more behind a request sent again: a first answer
                // that did its work (a release that deleted the key, the
                // earlier request's second send coming before it) stands
                // over a second that found nothing left to do.
                let value = match earlier {
                    Some(Value::Int(done)) if done > 0 && value == Value::Int(0) => {
                        Value::Int(done)
                    }
                    _ => value,
                };
                node.answered();
                if marked != Marked::No {
                    node.known.learn(&value, node.old_after);
                }
                return Ok(value);
            }
            Some(Err(error)) => {
                if !matches!(error, NodeError::Unreachable(_)) {
                    // An error reply: the node talks.
                    node.silence.heard();
                }
                if checked.is_some() && !matches!(error, NodeError::Unreachable(_)) {
                    // The pipeline's `SET` refused (a key of the wrong
                    // type, a server without `SET … NX … GET`, say): the
                    // script, with its own fallbacks, decides.
                    checked = None;
                    continue;
                }
                if !compat
                    && refuses_nx_get(&error)
                    && let Some(instead) = request.compat()
                {
                    // A server older than Redis 7.0 that `INFO` did not
                    // tell about (an ACL that denies it): from now on it
                    // gets the script.
                    node.set_old_set();
                    request = instead;
                    compat = true;
                    continue;
                }
                if let Some(native) = native_fallback(&node, &request, &error) {
                    // The node refuses scripts: release with its own
                    // conditional delete instead, once.
                    request = Request::Cmd(Arc::new(native));
                    evalsha = None;
                    continue;
                }
                if !matches!(error, NodeError::Unreachable(_)) {
                    if std::mem::take(&mut take_back)
                        && let Some(back) = acquire::taken_back(&request)
                    {
                        // The pipeline's `SET` took and the script that was
                        // to decide refused (a marker of the wrong type, a
                        // user denied scripts): an error, which a failed
                        // attempt does not release. Boxed: rare, and kept
                        // out of every call's future.
                        Box::pin(take_back_key(&node, &back, timeout, &mut conn.conn)).await;
                    }
                    return Err(failed(shard_of_a_cluster(&node, error)));
                }
                node.broken(&conn);
                if retried || !may_send(mark, false) {
                    return Err(failed(error));
                }
                retried = true;
            }
        }
    }
}

/// Waits until the node's earlier requests on the lock (`after`) settled,
/// within a bound: twice what one of them may take when its runtime runs
/// it (a connection made and the request answered, twice over, as when
/// sent again), at least a second. Past it, the request counts as timed
/// out, and is not counted as the node's failure: the earlier requests'
/// runtime does not run them (a current-thread runtime, alive but not
/// driven, where the lock was taken), and a release waiting for them
/// would wait as long, without end when that runtime never runs again.
/// The request is then not sent (or, queued behind them already, its
/// answer not taken): the earlier requests may still run on the node
/// after it, though an acquisition's is never sent again that late
/// ([`Settled::may_send`](crate::engine::inflight::Settled::may_send)).
async fn earlier_settled(
    node: &Node,
    after: &InFlight,
    index: usize,
    timeout: Duration,
) -> Result<(), NodeError> {
    if after.settled_now(index) {
        return Ok(());
    }
    let (_, connect) = node.dial();
    let bound = connect
        .saturating_add(timeout)
        .saturating_mul(4)
        .max(Duration::from_secs(1));
    // Boxed: the timer's state, inline, took each node's request future
    // past the allocator's per-thread cache (see round's size test).
    match Box::pin(tokio::time::timeout(bound, after.settled(index))).await {
        Ok(()) => Ok(()),
        Err(_) => Err(NodeError::Timeout),
    }
}

/// Whether a round's request may still be sent after a wait
/// ([`Settled::may_send`](crate::engine::inflight::Settled::may_send)).
fn may_send(mark: Option<&Mark>, again: bool) -> bool {
    mark.is_none_or(|mark| mark.settled.may_send(again))
}

/// What a round makes once for all its nodes' requests.
#[derive(Clone, Default)]
pub(crate) struct Prepared {
    /// The guarded acquisition's pipeline for nodes known to be old
    /// ([`acquire::known_old`]).
    pub(crate) known_old: Option<Request>,
    /// The `EVALSHA` of a script without a marker
    /// ([`prebuilt`](crate::engine::send::prebuilt)).
    pub(crate) evalsha: Option<Arc<Cmd>>,
}

/// Releases our key on a node where the guarded pipeline's `SET` took and
/// the script that was to decide failed ([`acquire::taken_back`]): best
/// effort, on the script's connection and behind it, within one node
/// timeout in all; the native conditional delete where the node refuses
/// the script. Where it fails too, the key stays until its ttl (it blocks
/// others on that node only: the node did not count).
async fn take_back_key(node: &Node, back: &Request, timeout: Duration, conn: &mut NodeConn) {
    let native = unlock::native_instead(node.native_release(), back);
    let _ = tokio::time::timeout(timeout, async {
        if run(back, None, conn, None).await.is_err()
            && let Some(native) = native
        {
            let _ = native.query_async::<Value>(conn).await;
        }
    })
    .await;
}

/// A request on its round's deadline: answers `None` (timed out) once the
/// round's timer fired, else what the request answers. It needs no timer
/// of its own: the round polls every pending request when its timer fires
/// ([`Fanout`](crate::engine::fanout::Fanout)).
struct Expiring<'a, F> {
    sent: F,
    expired: &'a std::sync::atomic::AtomicBool,
}

impl<F: Future + Unpin> Future for Expiring<'_, F> {
    type Output = Option<F::Output>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.expired.load(std::sync::atomic::Ordering::Acquire) {
            return std::task::Poll::Ready(None);
        }
        std::pin::Pin::new(&mut self.sent).poll(cx).map(Some)
    }
}

/// The native conditional delete to send instead of the single-key unlock
/// script, when the node refused the script (scripting denied by its ACL,
/// or `EVALSHA` renamed away) and has one (see [`Node::native_release`]).
fn native_fallback(node: &Node, request: &Request, error: &NodeError) -> Option<Cmd> {
    let NodeError::Reply(e) = error else {
        return None;
    };
    let refused = match e.code() {
        Some("NOPERM") => true,
        _ => e
            .to_string()
            .to_ascii_lowercase()
            .contains("unknown command"),
    };
    if !refused {
        return None;
    }
    unlock::native_instead(node.native_release(), request)
}

/// A redirection (`MOVED`, `ASK`) from a node given as a standalone
/// master: it is a shard of a cluster, a mistake in the node list that no
/// retry fixes (its `Display` says to name the whole cluster). From a
/// cluster node it stays transient (a slot that moved twice within
/// redis-rs's retries).
fn shard_of_a_cluster(node: &Node, error: NodeError) -> NodeError {
    match error {
        NodeError::Busy(e) if !node.is_cluster() && matches!(e.code(), Some("MOVED" | "ASK")) => {
            NodeError::Reply(e)
        }
        other => other,
    }
}

/// Whether `error` is a server's refusal of `SET … NX … GET`: Redis before
/// 7.0 answers it with a syntax error.
fn refuses_nx_get(error: &NodeError) -> bool {
    matches!(error, NodeError::Reply(e) if e.to_string().to_ascii_lowercase().contains("syntax error"))
}
