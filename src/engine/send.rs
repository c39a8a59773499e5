//! Sending one request on one node's connection and reading its raw
//! reply: a standalone node's command, pipeline or script (`EVALSHA` with
//! the `NOSCRIPT` fallback), the durable write with its confirmation in one
//! pipeline, and a cluster node's request, cut per hash slot when its keys
//! span several.
//!
//! # `NOSCRIPT`
//! A node that answers `EVALSHA` with `NOSCRIPT` (restarted, `SCRIPT
//! FLUSH`, a replica just promoted) gets the script once more. A standalone
//! node loads it (`SCRIPT LOAD`) and runs `EVALSHA` again on the same
//! connection. A cluster node is sent `EVAL` with the script's source
//! instead, routed by its keys to the slot's master, which caches the
//! script there: redis-rs's cluster client sends `SCRIPT LOAD` to every
//! node of the cluster, replicas included, and fails it unless all of them
//! answer, so one silent node (a paused replica, an old master paused
//! through a failover) would keep the script from being loaded until the
//! cluster forgot that node.

use std::future::Future;

use futures::future::Either;
use redis::{RedisResult, Value};

use crate::engine::node::NodeConn;
use crate::protocol::durability::Durability;
use crate::protocol::error::NodeError;
use crate::protocol::request::{Marked, Request};
use crate::protocol::scripts::Script;

/// Sends `request` on `conn` and reads the raw reply. A marked script gets
/// `known` (the node's known generation, or nothing) as its last argument.
///
/// A standalone node's request is [`run_local`] as it is; a cluster node's
/// goes boxed, so that its larger state stays out of every request's future.
///
/// `evalsha`, when given, is `request`'s `EVALSHA` as [`prebuilt`] made it
/// once for a round's nodes; a cluster node builds its own.
pub(crate) fn run<'a>(
    request: &'a Request,
    known: Option<&'a [u8]>,
    conn: &'a mut NodeConn,
    evalsha: Option<&'a redis::Cmd>,
) -> Either<BoxedRun<'a>, impl Future<Output = Result<Value, NodeError>> + Send + 'a> {
    #[cfg(feature = "cluster")]
    if conn.is_cluster() {
        return Either::Left(Box::pin(run_cluster(request, known, conn)));
    }
    Either::Right(run_local(request, known, conn, evalsha))
}

/// The `EVALSHA` of a script request that carries no marker, made once
/// for every node of a round: it is the same for each (a marked script
/// names each node's known generation, and is built per node). Building it
/// per node was two allocations and a copy of every key and argument per
/// request, five times a release.
pub(crate) fn prebuilt(request: &Request) -> Option<std::sync::Arc<redis::Cmd>> {
    match request {
        Request::Script {
            script,
            keys,
            args,
            marked: Marked::No,
            ..
        } => Some(std::sync::Arc::new(evalsha(
            script,
            keys,
            args,
            Marked::No,
            None,
        ))),
        _ => None,
    }
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
        let sent = Box::pin(run_local(&local, known, conn, None)).await;
        // The waiting acquisition goes as a script; a user denied
        // scripts sends it as before (a pipeline: no `ASK` during a
        // migration, one round trip more).
        if let (Request::Set(_), Err(NodeError::Reply(e))) = (request, &sent)
            && e.code() == Some("NOPERM")
        {
            return run_local(request, known, conn, None).await;
        }
        return sent;
    }
    run_local(request, known, conn, None).await
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
        async move { Box::pin(run(part, known, &mut conn, None)).await }
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
            async move { Box::pin(run(&release, None, &mut conn, None)).await }
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
    evalsha: Option<&redis::Cmd>,
) -> Result<Value, NodeError> {
    match request {
        // Boxed: durability is a choice of few, its state stays out of
        // every request's future.
        Request::Durable { write, durability } => {
            Box::pin(run_durable(write, *durability, known, conn)).await
        }
        other => run_plain(other, known, conn, evalsha)
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
    prebuilt: Option<&redis::Cmd>,
) -> RedisResult<Value> {
    match request {
        Request::Durable { write, .. } => Box::pin(run_plain(write, known, conn, None)).await,
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
            // `EVALSHA` built here, with the `NOSCRIPT` fallback (see the
            // module docs): redis-rs's `ScriptInvocation` copies every key
            // and argument twice more (a twentieth of a cycle's client
            // time), and its fallback is `SCRIPT LOAD`.
            let built;
            let evalsha = match prebuilt {
                Some(cmd) if *marked == Marked::No => cmd,
                _ => {
                    built = evalsha(script, keys, args, *marked, known);
                    &built
                }
            };
            match evalsha.query_async(conn).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    if conn.is_cluster() {
                        // Boxed: the fallback's state stays out of every
                        // request's future.
                        return Box::pin(run_eval(script, keys, args, *marked, known, conn)).await;
                    }
                    load(script).query_async::<()>(conn).await?;
                    evalsha.query_async(conn).await
                }
                other => other,
            }
        }
    }
}

/// A cluster node's answer to `NOSCRIPT`: `EVAL` of `script`'s source (see
/// the module docs).
async fn run_eval(
    script: &Script,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    marked: Marked,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> RedisResult<Value> {
    eval(script, keys, args, marked, known)
        .query_async(conn)
        .await
}

/// `SCRIPT LOAD` of `script`: a standalone node's answer to `NOSCRIPT`.
fn load(script: &Script) -> redis::Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(script.source());
    cmd
}

/// `EVALSHA` of `script` over `keys` and `args`, with the known generation
/// last for a marked script, sized ahead.
fn evalsha(
    script: &Script,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    marked: Marked,
    known: Option<&[u8]>,
) -> redis::Cmd {
    invocation("EVALSHA", script.hash(), keys, args, marked, known)
}

/// `EVAL` of `script`'s source, otherwise as [`evalsha`].
fn eval(
    script: &Script,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    marked: Marked,
    known: Option<&[u8]>,
) -> redis::Cmd {
    invocation("EVAL", script.source(), keys, args, marked, known)
}

/// `verb` (`EVALSHA` or `EVAL`) of `script` (its hash or its source) over
/// `keys` and `args`, with the known generation last for a marked script,
/// sized ahead.
fn invocation(
    verb: &str,
    script: &str,
    keys: &[Vec<u8>],
    args: &[Vec<u8>],
    marked: Marked,
    known: Option<&[u8]>,
) -> redis::Cmd {
    let extra = usize::from(marked != Marked::No);
    let bytes: usize = keys.iter().chain(args.iter()).map(Vec::len).sum();
    let mut cmd = redis::Cmd::with_capacity(
        3 + keys.len() + args.len() + extra,
        verb.len() + script.len() + 20 + bytes + known.map_or(0, <[u8]>::len),
    );
    cmd.arg(verb).arg(script).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_slice());
    }
    for arg in args {
        cmd.arg(arg.as_slice());
    }
    if marked != Marked::No {
        cmd.arg(known_arg(marked, known));
    }
    cmd
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
/// trip). `EVALSHA` answered with `NOSCRIPT` sends the pipeline once more:
/// after `SCRIPT LOAD` on a standalone node, with `EVAL` of the source in
/// place of `EVALSHA` on a cluster node (see the module docs). The write's
/// reply comes back when the node confirmed it; [`NodeError::NotDurable`]
/// when the node answered but did not confirm in time (the write may be
/// there: the node counts as unknown), and [`NodeError::Durability`] when
/// it cannot confirm at all (the command is unknown there, or AOF is off
/// for `WAITAOF`).
async fn run_durable(
    write: &Request,
    durability: Durability,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    // Whether the node answered `NOSCRIPT` once already.
    let mut noscript = false;
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
                pipe.add_command(if noscript && conn.is_cluster() {
                    eval(script, keys, args, *marked, known)
                } else {
                    evalsha(script, keys, args, *marked, known)
                });
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
                Request::Script { script, .. } if error.code() == "NOSCRIPT" && !noscript => {
                    if !conn.is_cluster() {
                        load(script)
                            .query_async::<()>(conn)
                            .await
                            .map_err(NodeError::from_redis)?;
                    }
                    noscript = true;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::request::unlock;

    /// The round's one `EVALSHA` is the one each node would have built,
    /// byte for byte, and a marked script (whose last argument is each
    /// node's own) gets none.
    #[test]
    fn a_rounds_evalsha_is_what_each_node_would_send() {
        for (keys, quiet) in [(&["k1"][..], false), (&["k1", "k2", "k3"][..], true)] {
            let request = unlock::request(keys, "token", quiet);
            let Request::Script {
                script,
                keys,
                args,
                marked,
                ..
            } = &request
            else {
                panic!("an unlock is a script");
            };
            let per_node = evalsha(script, keys, args, *marked, None);
            let once = prebuilt(&request).expect("an unmarked script is prebuilt");
            assert_eq!(once.get_packed_command(), per_node.get_packed_command());
        }
        let generation = crate::protocol::generation::Generation {
            marker: crate::protocol::keys::marker_key(""),
            candidate: "c".into(),
            guard: Some(std::time::Duration::from_secs(1)),
        };
        let marked = crate::protocol::request::marked(
            &generation,
            &crate::protocol::scripts::UNLOCK,
            &[b"k1"],
            &[b"token"],
            Marked::Known,
        );
        assert!(prebuilt(&marked).is_none(), "a marked script is per node");
        let set = redis::cmd("SET");
        assert!(prebuilt(&Request::Cmd(std::sync::Arc::new(set))).is_none());
    }
}
