//! What a link sends on its node's ordinary connection, beside the
//! subscriptions: the manager's registrations and their removals, the
//! releases it passes on, and the keys' waiting flags
//! ([`keys::waiting_key`](crate::protocol::keys::waiting_key), the
//! release's gate). See the [module docs](super) for the protocol.

use std::sync::Weak;
use std::time::Duration;

use redis::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::state::Shared;
use crate::engine::node::Node;
use crate::protocol::request::register;

/// The bound on a batch of registrations (sent on the node's ordinary
/// connection, not awaited by the link).
const SIDE_TIMEOUT: Duration = Duration::from_secs(1);

/// The most batches of registrations (and passed-on releases) waiting to
/// be sent to one node; past that, a batch is dropped (a registration is
/// sent again at the next renewal; a release passed on is then published
/// by its releaser's hand-off check, [`HANDOFF_CHECK`](crate::protocol::timing::HANDOFF_CHECK)).
const SIDE_QUEUE: usize = 64;

/// A batch for the side task.
pub(super) enum Side {
    /// Commands whose replies do not matter: a registration that fails (an
    /// ACL, a node down) only means that releases there do not name this
    /// manager, and its waiters are woken as before the registration.
    Commands(Vec<redis::Cmd>),
    /// The renewal of the waiting flags of these release channels' keys
    /// (a standalone node's). A flag that was gone (evicted, flushed, or
    /// lapsed while the node or this process stood still) is set again and
    /// its key's waiters here are woken to try once more: a release may
    /// have found no flag, and published nothing.
    Flags(Vec<Vec<u8>>),
}

/// Aborts the session's side task when the session ends: a node that
/// hangs must not keep a queue of them alive.
pub(super) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a session's side task: its batches go out in order, so that the
/// link keeps reading messages. Their order against the subscriptions does
/// not matter for safety: a release that names this manager where it is
/// not subscribed reaches nobody, and is then published for every manager
/// (the flags a waiter relies on are set before, by [`set_flags`]). The
/// queue is bounded, and the task ends with the session.
pub(super) fn start(
    node: std::sync::Arc<Node>,
    shared: Weak<Shared>,
    lease: Duration,
) -> (mpsc::Sender<Side>, AbortOnDrop) {
    let (side, mut queued) = mpsc::channel::<Side>(SIDE_QUEUE);
    let task = tokio::spawn(async move {
        let cluster = node.is_cluster();
        // A renewal whose reply was not read (timed out, failed): whether
        // it found a flag gone is unknown, and it may have set the flag
        // again when it ran, so the next one cannot tell either.
        let mut unsure = false;
        while let Some(batch) = queued.recv().await {
            match batch {
                Side::Commands(cmds) => queue_commands(&node, cmds, cluster).await,
                Side::Flags(channels) => {
                    unsure = !renew_flags(&node, &shared, channels, lease, unsure).await;
                }
            }
        }
    });
    (side, AbortOnDrop(task))
}

/// Sends `cmds` to the node on its ordinary connection in one pipeline
/// (on a cluster node, each on its own, to its slot's master), within
/// [`SIDE_TIMEOUT`], ignoring the replies.
async fn queue_commands(node: &Node, cmds: Vec<redis::Cmd>, cluster: bool) {
    if cmds.is_empty() {
        return;
    }
    let _ = tokio::time::timeout(SIDE_TIMEOUT, async {
        let Ok(conn) = node.connection().await else {
            return;
        };
        let conn = conn.conn;
        if cluster {
            let sent = cmds.into_iter().map(|cmd| {
                let mut conn = conn.clone();
                async move {
                    let _: Result<(), _> = cmd.query_async(&mut conn).await;
                }
            });
            futures::future::join_all(sent).await;
        } else {
            let mut pipe = redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd).ignore();
            }
            let mut conn = conn;
            let _: Result<(), _> = pipe.query_async(&mut conn).await;
        }
    })
    .await;
}

/// Sets the waiting flags `flags` ([`register::flag`]) on the node's
/// ordinary connection, in one pipeline, and waits for the node's answer:
/// the link confirms its subscriptions to the waiters only then, so that
/// their next attempt reaches the node after the flags. A denial (an ACL
/// that does not allow `SET` on the flag) counts as a denied
/// subscription (the link's to judge): waiters there use the timed retry.
/// `Err(None)`: no connection.
pub(super) async fn set_flags(
    node: &Node,
    flags: impl Iterator<Item = redis::Cmd>,
) -> Result<(), Option<redis::RedisError>> {
    let mut pipe = redis::pipe();
    for flag in flags {
        pipe.add_command(flag).ignore();
    }
    let conn = node.connection().await.map_err(|_| None)?;
    let mut conn = conn.conn;
    pipe.query_async::<()>(&mut conn).await.map_err(Some)
}

/// Renews the waiting flags of `channels`' keys with `SET … GET`, within
/// [`SIDE_TIMEOUT`]; where the reply shows that a flag was gone, wakes the
/// waiters of its key (see [`Side::Flags`]). `unsure`: the last renewal's
/// reply was not read, so every key's waiters are woken once this one's
/// is (a node cut off past the lease lost the flags, and that renewal,
/// run late, set them again unseen). Returns whether the reply was read.
async fn renew_flags(
    node: &Node,
    shared: &Weak<Shared>,
    channels: Vec<Vec<u8>>,
    lease: Duration,
    unsure: bool,
) -> bool {
    if channels.is_empty() {
        return !unsure;
    }
    let mut pipe = redis::pipe();
    for channel in &channels {
        pipe.add_command(register::renew_flag(channel, lease));
    }
    let replies = tokio::time::timeout(SIDE_TIMEOUT, async {
        let conn = node.connection().await.ok()?;
        let mut conn = conn.conn;
        pipe.query_async::<Vec<Value>>(&mut conn).await.ok()
    })
    .await;
    let Ok(Some(replies)) = replies else {
        return false;
    };
    let Some(shared) = shared.upgrade() else {
        return true;
    };
    let state = shared.lock();
    for (channel, reply) in channels.iter().zip(&replies) {
        if *reply != Value::Nil && !unsure {
            continue;
        }
        crate::trace::debug!(
            node = node.label(),
            "a waiting flag was gone; its waiters try again"
        );
        if let Some(entry) = state.channels.get(channel) {
            for slot in &entry.waiters {
                slot.wake.notify_one();
            }
        }
    }
    true
}
