//! A cluster node's share of a request over keys in several hash slots
//! (feature `cluster`): one script per slot, all sent at once on the
//! node's cluster connection, their replies combined into the node's one
//! answer (see [`shard`](crate::protocol::request::shard)).

use futures::future::join_all;
use redis::Value;

use crate::engine::node::NodeConn;
use crate::engine::round::run;
use crate::protocol::error::NodeError;
use crate::protocol::request::shard::{self, Combine, Split};

/// Runs each part of `split` (at once, each routed to its slot's master)
/// and combines their replies. Where an acquisition's parts did not all
/// set their keys (a refusal, an error, a timeout's cut), the parts that
/// did are released quietly before the node answers, so that a node never
/// keeps part of a set it did not agree to.
///
/// # Cancel safety
/// Not cancel-safe: a part already sent runs on its master; dropped
/// before the release of the parts that agreed, those keep their keys
/// until the ttl (the round releases everywhere a lock it did not grant).
pub(crate) async fn run_split(
    split: Split,
    known: Option<&[u8]>,
    conn: &mut NodeConn,
) -> Result<Value, NodeError> {
    let Split {
        combine,
        parts,
        token,
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
    Ok(shard::combine(combine, &replies))
}
