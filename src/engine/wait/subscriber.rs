//! One session's subscription connection to one node, as the link
//! ([`super::link`]) sees it: subscribe and unsubscribe channels, and read
//! what comes. A standalone node takes plain `SUBSCRIBE` on a dedicated
//! pub/sub connection. A cluster node (feature `cluster`) takes sharded
//! pub/sub, `SSUBSCRIBE`, on a RESP3 cluster connection that routes each
//! channel to the master of its slot; there the names of the waiting
//! protocol are in the lock key's slot ([`shard::wire_name`]),
//! and the link only ever sees the standalone names.

use std::borrow::Cow;

use futures::StreamExt;
use redis::RedisResult;

use crate::engine::node::{Dial, Node};
use crate::protocol::error::NodeError;
#[cfg(feature = "cluster")]
use crate::protocol::request::shard;

/// What a subscription connection delivered.
pub(super) enum Event {
    /// A message on `channel` (its standalone name).
    Message { channel: Vec<u8>, payload: Vec<u8> },
    /// The node ended the subscription of `channel` by itself (its slot
    /// moved to another master, on a cluster node).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Dropped(Vec<u8>),
}

/// A session's subscription connection.
pub(super) enum Subscriber {
    Single {
        sink: redis::aio::PubSubSink,
        stream: redis::aio::PubSubStream,
    },
    #[cfg(feature = "cluster")]
    Cluster {
        conn: redis::cluster_async::ClusterConnection,
        pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
        /// Per channel (as named on the node), the confirmations of this
        /// session's own `SUNSUBSCRIBE`s not read yet: redis-rs copies
        /// every confirmation to the pushes, where it must not be taken
        /// for the server ending the subscription.
        leaving: std::collections::HashMap<Vec<u8>, u32>,
    },
}

impl Subscriber {
    /// A new subscription connection to `node`, made within its connect
    /// timeout.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped attempt leaves nothing behind.
    pub(super) async fn connect(node: &Node) -> Result<Self, NodeError> {
        let (dial, timeout) = node.dial();
        let made = match dial {
            Dial::Single(client) => tokio::time::timeout(timeout, client.get_async_pubsub())
                .await
                .map(|made| {
                    made.map(|pubsub| {
                        let (sink, stream) = pubsub.split();
                        Subscriber::Single { sink, stream }
                    })
                }),
            #[cfg(feature = "cluster")]
            Dial::Cluster(_, subscribing) => tokio::time::timeout(timeout, subscribing.connect())
                .await
                .map(|made| {
                    made.map(|(conn, pushes)| Subscriber::Cluster {
                        conn,
                        pushes,
                        leaving: Default::default(),
                    })
                }),
        };
        match made {
            Err(_) => Err(NodeError::Timeout),
            Ok(Err(e)) => Err(NodeError::from_redis(node.hint_tls(e))),
            Ok(Ok(subscriber)) => Ok(subscriber),
        }
    }

    /// The name of `name` (a channel, or a key of the waiting protocol) on
    /// this node.
    pub(super) fn wire<'a>(&self, name: &'a [u8]) -> Cow<'a, [u8]> {
        match self {
            Subscriber::Single { .. } => Cow::Borrowed(name),
            #[cfg(feature = "cluster")]
            Subscriber::Cluster { .. } => Cow::Owned(shard::wire_name(name)),
        }
    }

    /// Whether the node is a cluster (its commands go one slot at a time).
    pub(super) fn is_cluster(&self) -> bool {
        !matches!(self, Subscriber::Single { .. })
    }

    /// Subscribes `channels` (standalone names).
    ///
    /// # Cancel safety
    /// Not cancel-safe: a dropped call may have subscribed some of them;
    /// the link then ends the session.
    pub(super) async fn subscribe(&mut self, channels: &[Vec<u8>]) -> RedisResult<()> {
        match self {
            Subscriber::Single { sink, .. } => sink.subscribe(channels).await,
            #[cfg(feature = "cluster")]
            Subscriber::Cluster { conn, .. } => {
                // One command per slot, all at once (each to its master).
                let sent = by_slot(channels).into_iter().map(|group| {
                    let mut conn = conn.clone();
                    async move { conn.ssubscribe(group).await }
                });
                futures::future::try_join_all(sent).await.map(|_| ())
            }
        }
    }

    /// Unsubscribes `channels` (standalone names).
    ///
    /// # Cancel safety
    /// Not cancel-safe, as [`Subscriber::subscribe`].
    pub(super) async fn unsubscribe(&mut self, channels: &[Vec<u8>]) -> RedisResult<()> {
        match self {
            Subscriber::Single { sink, .. } => sink.unsubscribe(channels).await,
            #[cfg(feature = "cluster")]
            Subscriber::Cluster { conn, leaving, .. } => {
                let groups = by_slot(channels);
                for name in groups.iter().flatten() {
                    *leaving.entry(name.clone()).or_default() += 1;
                }
                let sent = groups.into_iter().map(|group| {
                    let mut conn = conn.clone();
                    async move { conn.sunsubscribe(group).await }
                });
                futures::future::try_join_all(sent).await.map(|_| ())
            }
        }
    }

    /// What comes next; `None` once the connection broke. On a cluster
    /// node, a connection to one of its masters that broke (redis-rs makes
    /// it again by itself) ends the session too: a release may have been
    /// published there meanwhile, and a new session wakes every waiter.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is taken from the connection unless returned.
    pub(super) async fn next(&mut self) -> Option<Event> {
        match self {
            Subscriber::Single { stream, .. } => {
                let message = stream.next().await?;
                Some(Event::Message {
                    channel: message.get_channel::<Vec<u8>>().unwrap_or_default(),
                    payload: message.get_payload_bytes().to_vec(),
                })
            }
            #[cfg(feature = "cluster")]
            Subscriber::Cluster {
                pushes, leaving, ..
            } => loop {
                let push = pushes.recv().await?;
                let name = |i: usize| match push.data.get(i) {
                    Some(redis::Value::BulkString(b)) => Some(b.as_slice()),
                    _ => None,
                };
                match push.kind {
                    redis::PushKind::SMessage => {
                        let (Some(channel), Some(payload)) = (name(0), name(1)) else {
                            continue;
                        };
                        return Some(Event::Message {
                            channel: shard::unwire_name(channel).to_vec(),
                            payload: payload.to_vec(),
                        });
                    }
                    redis::PushKind::SUnsubscribe => {
                        let Some(channel) = name(0) else {
                            continue;
                        };
                        // The confirmation of our own unsubscription.
                        if let Some(n) = leaving.get_mut(channel) {
                            *n -= 1;
                            if *n == 0 {
                                leaving.remove(channel);
                            }
                            continue;
                        }
                        return Some(Event::Dropped(shard::unwire_name(channel).to_vec()));
                    }
                    redis::PushKind::Disconnection => return None,
                    _ => {}
                }
            },
        }
    }
}

/// `channels` (standalone names) as they are named on a cluster node,
/// grouped by slot: `SSUBSCRIBE` takes the channels of one slot.
#[cfg(feature = "cluster")]
fn by_slot(channels: &[Vec<u8>]) -> Vec<Vec<Vec<u8>>> {
    let mut groups: std::collections::HashMap<u16, Vec<Vec<u8>>> = std::collections::HashMap::new();
    for channel in channels {
        let wired = shard::wire_name(channel);
        groups.entry(shard::slot(&wired)).or_default().push(wired);
    }
    groups.into_values().collect()
}
