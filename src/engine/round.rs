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

use futures::stream::{FuturesUnordered, StreamExt};
use redis::{Cmd, RedisResult, Value};
use std::sync::atomic::AtomicBool;

use tokio::sync::Notify;

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
pub(crate) async fn run(
    request: &Request,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    #[cfg(feature = "cluster")]
    if conn.is_cluster() {
        use crate::protocol::request::shard;
        if let Some(split) = shard::split(request)? {
            return run_split(split, known, conn).await;
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
        Request::Durable { write, durability } => {
            run_durable(write, *durability, known, conn).await
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
            let mut call = script.prepare_invoke();
            for key in keys.iter() {
                call.key(key.as_slice());
            }
            for arg in args.iter() {
                call.arg(arg.as_slice());
            }
            if *marked != Marked::No {
                call.arg(known_arg(*marked, known));
            }
            call.invoke_async(conn).await
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

/// Sends `request` to one node: waits for the node's earlier requests on the
/// same lock (`after`), connects within the connect timeout, and waits for
/// the reply within the node timeout (plus [`PER_KEY`](crate::protocol::request::PER_KEY) for each key past the
/// first, see [`Request::timeout`]). A request on a connection that turns
/// out to be broken (the node restarted since it was made) is sent once more
/// on a fresh one.
pub(crate) async fn call(
    node: Arc<Node>,
    index: usize,
    request: Request,
    node_timeout: Duration,
    after: InFlight,
) -> Result<Value, NodeError> {
    after.settled(index).await;
    let timeout = request.timeout(node_timeout);
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
    let mut checked = match &known {
        Some(_) if !compat && !node.is_cluster() => acquire::known_old(&request),
        _ => None,
    };
    loop {
        let mut conn = node.connection().await?;
        let sent = run(
            checked.as_ref().unwrap_or(&request),
            known.as_deref(),
            &mut conn.conn,
        );
        match tokio::time::timeout(timeout, sent).await {
            Err(_) => {
                node.timed_out(&conn);
                return Err(NodeError::Timeout);
            }
            Ok(Ok(value)) if checked.is_some() => {
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
            Ok(Ok(value)) => {
                node.answered();
                if marked != Marked::No {
                    node.known.learn(&value, node.old_after);
                }
                return Ok(value);
            }
            Ok(Err(error)) => {
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
    let settled = Arc::new(Settled {
        done: nodes
            .iter()
            .enumerate()
            .map(|(index, _)| AtomicBool::new(only.is_some_and(|only| !only.contains(&index))))
            .collect(),
        changed: Notify::new(),
    });
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .filter(|(index, _)| only.is_none_or(|only| only.contains(index)))
        .map(|(index, node)| {
            let (node, request, after) = (node.clone(), request.clone(), after.clone());
            let mark = Mark {
                settled: settled.clone(),
                index,
            };
            // Boxed, and the request's future made inside the box: the set
            // holds a pointer, and the request's state is never moved
            // (moving each node's future into the set was a tenth of a
            // cycle's client time in `memcpy`).
            Box::pin(async move {
                let outcome = call(node, index, request, node_timeout, after).await;
                drop(mark);
                (index, outcome)
            })
        })
        .collect();

    let mut tally = Tally::new(ask, nodes.len());
    while let Some((index, outcome)) = pending.next().await {
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
        // Each is bounded by the timeouts, so the task ends soon.
        tokio::spawn(async move { while pending.next().await.is_some() {} });
    }
    // A round that heard every node leaves nothing in flight.
    Round {
        tally,
        in_flight: InFlight::of(settled),
    }
}
