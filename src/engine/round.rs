//! The quorum round: one request per node, all sent at once, each bounded
//! by the connect and node timeouts, counted by the [`Tally`] until the
//! outcome is certain.
//!
//! When a round stops at a quorum, the requests still pending are finished
//! by a spawned task, so that slower nodes get the write too. Anything that
//! later touches the same key on a node (a release, say) must come after
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
use std::time::Duration;

use std::future::Future;

use futures::FutureExt;
use futures::future::Either;
use futures::stream::StreamExt;

use crate::engine::fanout::Fanout;
use redis::{Cmd, RedisResult, Value};

use crate::engine::Inner;
pub(crate) use crate::engine::inflight::InFlight;
use crate::engine::inflight::{Mark, Settled};
use crate::engine::node::{Node, NodeConn};
use crate::protocol::durability::Durability;
use crate::protocol::error::NodeError;
use crate::protocol::quorum::{Ask, Reply};
pub(crate) use crate::protocol::request::Request;
use crate::protocol::request::unlock;
use crate::protocol::request::{Marked, acquire};
use crate::protocol::tally::Tally;
#[cfg(feature = "tracing")]
use crate::trace;

/// Sends `request` on `conn` and reads the raw reply. A marked script gets
/// `known` (the node's known generation, or nothing) as its last argument.
///
/// A standalone node's request is [`run_local`] as it is; a cluster node's
/// goes boxed, so that its larger state stays out of every request's future.
pub(crate) fn run<'a>(
    request: &'a Request,
    known: Option<&'a [u8]>,
    conn: &'a mut NodeConn,
) -> Either<BoxedRun<'a>, impl Future<Output = Result<Value, NodeError>> + Send + 'a> {
    #[cfg(feature = "cluster")]
    if conn.is_cluster() {
        return Either::Left(Box::pin(run_cluster(request, known, conn)));
    }
    Either::Right(run_local(request, known, conn))
}

/// A request's future, boxed.
pub(crate) type BoxedRun<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Value, NodeError>> + Send + 'a>>;

/// [`run`] on a cluster node.
#[cfg(feature = "cluster")]
async fn run_cluster(
    request: &Request,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    use crate::protocol::request::shard;
    if let Some(split) = shard::split(request)? {
        return Box::pin(run_split(split, known, conn)).await;
    }
    if let Some(local) = shard::localize(request) {
        let sent = Box::pin(run_local(&local, known, conn)).await;
        // The waiting acquisition goes as a script; a user denied
        // scripts sends it as before (a pipeline: no `ASK` during a
        // migration, one round trip more).
        if let (Request::Set(_), Err(NodeError::Reply(e))) = (request, &sent)
            && e.code() == Some("NOPERM")
        {
            return run_local(request, known, conn).await;
        }
        return sent;
    }
    run_local(request, known, conn).await
}

/// A cluster node's share of a request over keys in several hash slots
/// (see [`shard`](crate::protocol::request::shard)): runs each part of `split` (at once, each routed to its slot's master)
/// and combines their replies. Where an acquisition's parts did not all
/// set their keys (a refusal, an error, a timeout's cut), the parts that
/// did are released quietly before the node answers, so that a node never
/// keeps part of a set it did not agree to.
///
/// # Cancel safety
/// Not cancel-safe: a part already sent runs on its master; dropped
/// before the release of the parts that agreed, those keep their keys
/// until the ttl (the round releases everywhere a lock it did not grant).
#[cfg(feature = "cluster")]
pub(crate) async fn run_split(
    split: crate::protocol::request::shard::Split,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    use crate::protocol::request::shard::{self, Combine, Split};
    use futures::future::join_all;
    let Split {
        combine,
        parts,
        token,
        marked,
    } = split;
    let answers = join_all(parts.iter().map(|part| {
        let mut conn = conn.clone();
        async move { Box::pin(run(part, known, &mut conn)).await }
    }))
    .await;
    let complete = answers
        .iter()
        .all(|a| matches!(a, Ok(v) if combine != Combine::Acquire || shard::acquired(v)));
    if combine == Combine::Acquire && !complete {
        let releases = parts
            .iter()
            .zip(&answers)
            .filter(|(_, a)| matches!(a, Ok(v) if shard::acquired(v)))
            .filter_map(|(part, _)| shard::release(part, &token));
        let _ = join_all(releases.map(|release| {
            let mut conn = conn.clone();
            async move { Box::pin(run(&release, None, &mut conn)).await }
        }))
        .await;
    }
    let mut replies = Vec::with_capacity(answers.len());
    for answer in answers {
        replies.push(answer?);
    }
    Ok(shard::combine_marked(combine, marked, &replies))
}

/// [`run`] of a request a cluster node takes as it is.
async fn run_local(
    request: &Request,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    match request {
        // Boxed: durability is a choice of few, its state stays out of
        // every request's future.
        Request::Durable { write, durability } => {
            Box::pin(run_durable(write, *durability, known, conn)).await
        }
        other => run_plain(other, known, conn)
            .await
            .map_err(NodeError::from_redis),
    }
}

/// The last argument of a marked script: the generation the manager knows
/// to be old on the node, or empty (never a generation).
fn known_arg(marked: Marked, known: Option<&[u8]>) -> &[u8] {
    match marked {
        Marked::Known => known.unwrap_or_default(),
        Marked::WithAge | Marked::No => &[],
    }
}

/// [`run`] without the durability confirmation.
async fn run_plain(
    request: &Request,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> RedisResult<Value> {
    match request {
        Request::Durable { write, .. } => Box::pin(run_plain(write, known, conn)).await,
        Request::Cmd(cmd) => cmd.query_async(conn).await,
        Request::Pipe(pipe) => run_pipe(pipe, conn).await,
        Request::Set(set) => match set.modern() {
            Request::Cmd(cmd) => cmd.query_async(conn).await,
            Request::Pipe(pipe) => run_pipe(pipe, conn).await,
            _ => unreachable!("an acquisition is a command or a pipeline"),
        },
        Request::Script {
            script,
            keys,
            args,
            marked,
            ..
        } => {
            // `EVALSHA` built here, with the `NOSCRIPT` fallback of
            // `invoke_async`: a `ScriptInvocation` copies every key and
            // argument twice more (a twentieth of a cycle's client time).
            let extra = usize::from(*marked != Marked::No);
            let bytes: usize = keys.iter().chain(args.iter()).map(Vec::len).sum();
            let mut evalsha = redis::Cmd::with_capacity(
                3 + keys.len() + args.len() + extra,
                7 + 40 + 20 + bytes + known.map_or(0, <[u8]>::len),
            );
            evalsha
                .arg("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len());
            for key in keys.iter() {
                evalsha.arg(key.as_slice());
            }
            for arg in args.iter() {
                evalsha.arg(arg.as_slice());
            }
            if *marked != Marked::No {
                evalsha.arg(known_arg(*marked, known));
            }
            match evalsha.query_async(conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.load_async(conn).await?;
                    evalsha.query_async(conn).await
                }
                other => other,
            }
        }
    }
}

/// Sends `pipe`; the first reply's error is the request's error, a later
/// one is left in the array for the reader.
async fn run_pipe(pipe: &redis::Pipeline, conn: &mut NodeConn) -> RedisResult<Value> {
    let value: Value = pipe.query_async(conn).await?;
    if let Value::Array(replies) = &value
        && let Some(Value::ServerError(e)) = replies.first()
    {
        return Err(e.clone().into());
    }
    Ok(value)
}

/// Runs `write` and the durability confirmation in one pipeline (one round
/// trip). `EVALSHA` answered with `NOSCRIPT` loads the script and sends the
/// pipeline once more. The write's reply comes back when the node confirmed
/// it; [`NodeError::NotDurable`] when the node answered but did not confirm
/// in time (the write may be there: the node counts as unknown), and
/// [`NodeError::Durability`] when it cannot confirm at all (the command is
/// unknown there, or AOF is off for `WAITAOF`).
async fn run_durable(
    write: &Request,
    durability: Durability,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    let mut loaded = false;
    loop {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        match write {
            Request::Cmd(cmd) => {
                pipe.add_command((**cmd).clone());
            }
            Request::Set(set) => match set.modern() {
                Request::Cmd(cmd) => {
                    pipe.add_command((**cmd).clone());
                }
                _ => unreachable!("a durable acquisition has no PTTL behind it"),
            },
            Request::Script {
                script,
                keys,
                args,
                marked,
                ..
            } => {
                let evalsha = pipe.cmd("EVALSHA").arg(script.get_hash()).arg(keys.len());
                for key in keys.iter() {
                    evalsha.arg(key.as_slice());
                }
                for arg in args.iter() {
                    evalsha.arg(arg.as_slice());
                }
                if *marked != Marked::No {
                    evalsha.arg(known_arg(*marked, known));
                }
            }
            Request::Durable { .. } | Request::Pipe(_) => {
                unreachable!("a durable request wraps a command or a script")
            }
        }
        pipe.add_command(durability.command());
        let replies: Vec<Value> = pipe
            .query_async(conn)
            .await
            .map_err(NodeError::from_redis)?;
        // The write may have run: a reply of the wrong shape is an
        // unconfirmed write, not an error that says nothing was written.
        let [reply, confirmation]: [Value; 2] =
            replies.try_into().map_err(|_| NodeError::NotDurable)?;
        if let Value::ServerError(error) = &reply {
            match write {
                Request::Script { script, .. } if error.code() == "NOSCRIPT" && !loaded => {
                    script
                        .prepare_invoke()
                        .load_async(conn)
                        .await
                        .map_err(NodeError::from_redis)?;
                    loaded = true;
                    continue;
                }
                _ => return Err(NodeError::from_redis(error.clone().into())),
            }
        }
        // Any answer but a confirmation leaves the write unconfirmed, and
        // counted as unknown (released if the lock is not granted).
        return match confirmation {
            Value::ServerError(error) => Err(NodeError::Durability(error.into())),
            value if durability.confirmed(&value) => Ok(reply),
            _ => Err(NodeError::NotDurable),
        };
    }
}

/// Sends `request` to one node: after the node's earlier requests on the
/// same lock (`after`), queued behind them on their connection or once they
/// settled (see [`inflight`](crate::engine::inflight)), connects within the
/// connect timeout, and waits for the reply within the node timeout (plus
/// [`PER_KEY`](crate::protocol::request::PER_KEY) for each key past the
/// first, see [`Request::timeout`]). A request on a connection that turns
/// out to be broken (the node restarted since it was made) is sent once more
/// on a fresh one. `mark`, when given, records where the request went, for
/// the requests that come after it.
pub(crate) async fn call(
    node: Arc<Node>,
    index: usize,
    request: Request,
    node_timeout: Duration,
    after: InFlight,
    mark: Option<&Mark>,
    known_old: Option<Request>,
) -> Result<Value, NodeError> {
    // Whether earlier requests to the node may still run: this one then
    // goes after them (queued behind them, or once they settled).
    let mut behind = !after.settled_now(index);
    let timeout = request.timeout(node_timeout);
    let mut sends = 0u32;
    let mut retried = false;
    let mut request = request;
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
    // A guarded acquisition on a node known to be old: a transaction, not
    // the script (see `acquire::known_old`).
    // (Not on a cluster node: the transaction names the marker and the
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
    loop {
        if queued.take().is_some() {
            // Sent again: after the earlier requests settled.
            Box::pin(after.settled(index)).await;
        }
        // On the round's deadline: the first send, made at once (no
        // connection to make, nothing to wait for).
        let mut on_deadline = sends == 0 && mark.is_some();
        let mut conn = match node.connection_now() {
            Some(conn) => conn?,
            None => {
                on_deadline = false;
                node.connection().await?
            }
        };
        if std::mem::take(&mut behind) {
            match after.queued_on(index, conn.epoch) {
                Some(unsettled) if !node.is_cluster() => queued = Some((conn.epoch, unsettled)),
                _ => {
                    on_deadline = false;
                    Box::pin(after.settled(index)).await;
                    conn = node.connection().await?;
                }
            }
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
            let sent = Box::pin(tokio::task::unconstrained(run(
                sending,
                known.as_deref(),
                &mut conn.conn,
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
            // Polled once, the request is in the connection's queue (or
            // waits for room in it, in turn, first come first served):
            // later requests queue behind it.
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
            // them was sent again after it.
            Box::pin(after.settled(index)).await;
            if !after.still_behind(index, epoch, unsettled) {
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
                return Err(NodeError::Timeout);
            }
            Some(Ok(value)) if checked.is_some() => {
                let was = known.as_deref().unwrap_or_default();
                match acquire::read_known_old(&value, was) {
                    Ok(Some(short)) => return Ok(short),
                    Ok(None) => {
                        // The marker changed: the script reads its age.
                        node.known.forget();
                        known = None;
                        checked = None;
                        continue;
                    }
                    Err(e) => return Err(NodeError::from_redis(e)),
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
                if checked.is_some() && !matches!(error, NodeError::Unreachable(_)) {
                    // The transaction refused (a server that queues no
                    // `SET … NX … GET`, say): the script, with its own
                    // fallbacks, decides.
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
                    continue;
                }
                if !matches!(error, NodeError::Unreachable(_)) {
                    return Err(shard_of_a_cluster(&node, error));
                }
                node.broken(&conn);
                if retried {
                    return Err(error);
                }
                retried = true;
            }
        }
    }
}

/// A request on its round's deadline: answers `None` (timed out) once the
/// round's timer fired, else what the request answers. It needs no timer
/// of its own: the round polls every pending request when its timer fires
/// ([`Fanout`]).
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

/// The next outcome of a round's requests; once `timer` fired, the
/// requests on the round's deadline answer that they timed out.
async fn next<F: Future + Unpin>(
    pending: &mut Fanout<F>,
    mut timer: std::pin::Pin<&mut tokio::time::Sleep>,
    settled: &Settled,
) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        if !settled.expired.load(std::sync::atomic::Ordering::Relaxed)
            && timer.as_mut().poll(cx).is_ready()
        {
            settled
                .expired
                .store(true, std::sync::atomic::Ordering::Release);
        }
        pending.poll_next_unpin(cx)
    })
    .await
}

/// How long a round listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Until the outcome is certain: a quorum agreed, or the answers so far
    /// decide what the failure is ([`Tally::decided`]).
    Decided,
    /// Until every node answered (each still bounded by the timeouts).
    AllNodes,
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
/// certain. The requests still pending then are finished by a spawned task
/// when the round reached a quorum, and dropped when it did not (the caller
/// releases everywhere next, after each node's request settled). Each
/// node's request waits first for that node's requests in `after`.
///
/// # Cancel safety
/// Dropping the future drops the pending requests; a request already
/// written to a node's socket still runs there, before anything sent to
/// that node later.
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
    inner.warm_up().await;
    let nodes = &inner.nodes;
    let node_timeout = inner.config.node_timeout;
    // A guarded acquisition's form for nodes known to be old, made once
    // for the round (it was a twelfth of a guarded cycle's client time
    // made per node).
    let known_old = acquire::known_old(&request);
    let settled = Arc::new(Settled::new(nodes.len(), |index| {
        only.is_none_or(|only| only.contains(&index))
    }));
    let mut pending = Fanout::new(
        nodes
            .iter()
            .enumerate()
            .filter(|(index, _)| only.is_none_or(|only| only.contains(index)))
            .map(|(index, node)| {
                let (node, request, after) = (node.clone(), request.clone(), after.clone());
                let known_old = known_old.clone();
                let mark = Mark {
                    settled: settled.clone(),
                    index,
                };
                // Boxed: the set holds a pointer, and the request's state is
                // never moved (moving each node's future into the set was a
                // tenth of a cycle's client time in `memcpy`).
                Box::pin(async move {
                    let outcome = call(
                        node,
                        index,
                        request,
                        node_timeout,
                        after,
                        Some(&mark),
                        known_old,
                    )
                    .await;
                    drop(mark);
                    (index, outcome)
                })
            }),
    );

    // The round's one timer: every request sent at once is bounded by it
    // (a request that waited or was sent again has its own).
    let deadline = tokio::time::Instant::now() + request.timeout(node_timeout);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
    let mut tally = Tally::new(ask, nodes.len());
    while let Some((index, outcome)) = next(&mut pending, timer.as_mut(), &settled).await {
        let answer = outcome.and_then(|value| read(&value).map_err(NodeError::UnexpectedReply));
        if let Err(_cause) = &answer {
            inner.stats.node_failed(index, nodes[index].label());
            #[cfg(feature = "tracing")]
            trace::debug!(node = nodes[index].label(), cause = %_cause, "node did not agree");
        }
        tally.record(index, nodes[index].label(), answer);
        if until == Until::Decided && tally.decided() {
            break;
        }
    }
    if tally.quorum_at.is_some() && !pending.is_empty() {
        let settled_rest = settled.clone();
        // Each is bounded by the timeouts, so the task ends soon.
        tokio::spawn(async move {
            let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
            while next(&mut pending, timer.as_mut(), &settled_rest)
                .await
                .is_some()
            {}
        });
    }
    // A round that heard every node leaves nothing in flight.
    Round {
        tally,
        in_flight: InFlight::of(settled),
    }
}

#[cfg(test)]
mod tests {
    /// A node's request future (boxed once per node and round) stays under
    /// glibc's per-thread cache limit (1,032 bytes): a larger allocation
    /// takes the allocator's slow path, which also consolidates its fast
    /// bins (`malloc_consolidate` was 4 % of a cycle's client time when
    /// the future was 4 KiB).
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    #[test]
    fn a_node_request_future_fits_the_allocator_cache() {
        fn size<F: FnOnce() -> Fut, Fut>(_: F) -> usize {
            std::mem::size_of::<Fut>()
        }
        let call = size(|| super::call(todo!(), 0, todo!(), todo!(), todo!(), None, None));
        assert!(call <= 960, "a node's request future is {call} bytes");
    }
}
