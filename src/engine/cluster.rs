//! What cluster nodes need beyond a round (feature `cluster`): the
//! restart guard's generation markers, one per slot, made ahead. (A
//! request over several slots is cut and combined in the round:
//! [`run_split`](crate::engine::send::run_split).)

use redis::Value;

use std::sync::Arc;

use futures::StreamExt;

use crate::engine::node::Node;
use crate::engine::send;
use crate::protocol::generation::Generation;
use crate::protocol::request::{Kind, Marked, Request, shard};
use crate::protocol::scripts;

/// How many marker requests one cluster node gets at once.
const MARKERS_AT_ONCE: usize = 256;

/// Under the restart guard, starts a task that gives every slot of every
/// cluster node its generation marker where it is missing, born when it is
/// set on that master's clock (the script's `TIME`; a marker already there
/// keeps its age). So every slot of a cluster counts from the first
/// manager's start, as a standalone node does, instead of each slot being
/// young for the guard's `max_ttl` at its first lock.
///
/// Each master, once all its slots have markers, gets a flag in one of its
/// slots (`{<tag>}<prefix>`, `0xFF`, `generation-made`): a later manager
/// reads the flags (one `GET` per master) and makes markers only for a
/// master without one, one that is new or lost its data. A master that
/// restarts empty while managers run loses its slots' markers with their
/// keys: those slots are young again when next used, as they should be.
pub(crate) fn make_markers(nodes: &[Arc<Node>], generation: &Generation) {
    let nodes: Vec<Arc<Node>> = nodes.iter().filter(|n| n.is_cluster()).cloned().collect();
    if nodes.is_empty() {
        return;
    }
    let marker = generation.marker.clone();
    let candidate = generation.candidate.clone();
    for node in nodes {
        let (marker, candidate) = (marker.clone(), candidate.clone());
        tokio::spawn(async move { mark_node(node, marker, candidate).await });
    }
}

/// [`make_markers`] on one cluster node: each master's slots, unless its
/// flag says they were made.
async fn mark_node(node: Arc<Node>, marker: Vec<u8>, candidate: String) {
    let Ok(conn) = node.connection().await else {
        return;
    };
    let mut conn = conn.conn;
    let Ok(slots) = conn
        .ask_one::<Value>(redis::cmd("CLUSTER").arg("SLOTS"))
        .await
    else {
        return;
    };
    let mut flag = marker.to_vec();
    flag.extend_from_slice(b"-made");
    for ranges in masters(&slots) {
        let Some(&(first, _)) = ranges.first() else {
            continue;
        };
        let flag = shard::in_slot(&flag, first);
        let made: Result<Option<Vec<u8>>, _> =
            redis::cmd("GET").arg(&flag).query_async(&mut conn).await;
        if !matches!(made, Ok(None)) {
            continue;
        }
        let slots: Vec<u16> = ranges.iter().flat_map(|&(a, b)| a..=b).collect();
        let results: Vec<bool> = futures::stream::iter(slots)
            .map(|slot| {
                let mut conn = conn.clone();
                // Sent as a round's scripts are, so that a master that
                // answers `NOSCRIPT` gets `EVAL` (see `send`).
                let request = Request::Script {
                    script: &scripts::MARKER_INIT,
                    keys: Arc::from([shard::in_slot(&marker, slot)]),
                    args: Arc::from([candidate.as_bytes().to_vec()]),
                    kind: Kind::Other,
                    marked: Marked::No,
                };
                async move { send::run(&request, None, &mut conn, None).await.is_ok() }
            })
            .buffer_unordered(MARKERS_AT_ONCE)
            .collect()
            .await;
        if results.iter().all(|ok| *ok) {
            let _: Result<(), _> = redis::cmd("SET")
                .arg(&flag)
                .arg(1)
                .query_async(&mut conn)
                .await;
        }
    }
}

/// The slot ranges of each master in a `CLUSTER SLOTS` reply, grouped by
/// the master's address.
fn masters(reply: &Value) -> Vec<Vec<(u16, u16)>> {
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    let mut by_master: Vec<(Value, Vec<(u16, u16)>)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            continue;
        };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u16::try_from(*a), u16::try_from(*b)) else {
            continue;
        };
        let id = Value::Array(master.iter().take(2).cloned().collect());
        match by_master.iter_mut().find(|(m, _)| *m == id) {
            Some((_, list)) => list.push((a, b)),
            None => by_master.push((id, vec![(a, b)])),
        }
    }
    by_master.into_iter().map(|(_, list)| list).collect()
}
