//! The durability setting and its wire protocol: the confirmation command
//! pipelined behind a write of a lock, and how its reply is read.

use std::time::Duration;

/// What a node's agreement to a write (an acquisition, an extension, a
/// fencing write) must include before it counts towards the quorum. Set with
/// [`RedlockBuilder::durability`](crate::RedlockBuilder::durability).
///
/// The confirmation is pipelined behind the write, so it costs no extra
/// round trip, but the node answers only once it has confirmed (or its
/// timeout ran out): the time comes off the lock's validity. A node that
/// answers without confirming in time counts as not answering (its write is
/// released if the lock is not granted). A node that cannot confirm at all
/// (the command is unknown there, or AOF is off for `Disk`) gives
/// [`NodeError::Durability`](crate::NodeError::Durability): a configuration
/// error, never a silent downgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// The write is in the node's memory: the default, as in every Redlock
    /// client. Safe after a crash only with `appendfsync always`, or with a
    /// restart delayed past the largest ttl, or with the restart guard.
    #[default]
    Memory,
    /// The write reached the node's append-only file on disk: `WAITAOF 1 0
    /// <timeout>` (Redis 7.2 or later, Valkey). Needs `appendonly yes`; with
    /// `appendfsync everysec` this waits for the next fsync, up to a second.
    Disk {
        /// How long the node may wait for its fsync (`WAITAOF`'s timeout).
        /// Must be shorter than the node timeout.
        timeout: Duration,
    },
    /// The write reached this many replicas of the node: `WAIT <replicas>
    /// <timeout>`, for masters that have replicas and may fail over.
    Replicas {
        /// How many replicas must acknowledge the write.
        replicas: u32,
        /// How long the node may wait for them (`WAIT`'s timeout). Must be
        /// shorter than the node timeout.
        timeout: Duration,
    },
}

impl Durability {
    /// The confirmation command.
    pub(crate) fn command(self) -> redis::Cmd {
        let millis = |t: Duration| u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1);
        match self {
            Durability::Memory => redis::cmd("PING"),
            Durability::Disk { timeout } => {
                let mut cmd = redis::cmd("WAITAOF");
                cmd.arg(1).arg(0).arg(millis(timeout));
                cmd
            }
            Durability::Replicas { replicas, timeout } => {
                let mut cmd = redis::cmd("WAIT");
                cmd.arg(replicas).arg(millis(timeout));
                cmd
            }
        }
    }

    /// Whether the confirmation's reply confirms the write.
    pub(crate) fn confirmed(self, reply: &redis::Value) -> bool {
        use redis::Value;
        match (self, reply) {
            (Durability::Memory, _) => true,
            (Durability::Disk { .. }, Value::Array(counts)) => {
                matches!(counts.first(), Some(Value::Int(local)) if *local >= 1)
            }
            (Durability::Replicas { replicas, .. }, Value::Int(acked)) => {
                *acked >= i64::from(replicas)
            }
            _ => false,
        }
    }

    pub(crate) fn timeout(self) -> Option<Duration> {
        match self {
            Durability::Memory => None,
            Durability::Disk { timeout } | Durability::Replicas { timeout, .. } => Some(timeout),
        }
    }
}
