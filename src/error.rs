//! The crate's one error type and the per-node causes it carries.

use std::fmt;
use std::time::Duration;

use crate::guard::LossReason;

/// Everything that can go wrong when building a [`Redlock`](crate::Redlock)
/// or taking, extending and releasing a lock.
///
/// Variants that come from a quorum round carry the numbers a caller needs to
/// understand it: how many nodes agreed, how many were required, and what each
/// failing node said.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by someone else: enough nodes answered that a quorum
    /// was possible, but too many of them already hold the key with another
    /// value.
    #[error(
        "resource {resource:?} is locked by another holder ({held} of {nodes} nodes hold it, {required} needed for a quorum)"
    )]
    Conflict {
        /// The resource name asked for.
        resource: String,
        /// How many nodes answered that the key is held by another value.
        held: usize,
        /// How many nodes are needed for a quorum.
        required: usize,
        /// How many nodes the manager has.
        nodes: usize,
    },

    /// Too few nodes could be reached (they timed out, refused the connection
    /// or dropped it) for a quorum to agree.
    #[error("no quorum for {resource:?}: {granted} of {required} required nodes agreed; {}", NodeFailures(.failures))]
    NoQuorum {
        /// The resource name asked for.
        resource: String,
        /// How many nodes agreed.
        granted: usize,
        /// How many nodes are needed for a quorum.
        required: usize,
        /// What each node that did not agree said.
        failures: Vec<NodeFailure>,
    },

    /// A quorum agreed, but it took so long that no validity was left
    /// (validity = ttl − elapsed − drift). The keys were released again.
    #[error(
        "acquiring {resource:?} took {elapsed:?}, leaving no validity of the {ttl:?} ttl (drift {drift:?})"
    )]
    ValidityExpired {
        /// The resource name asked for.
        resource: String,
        /// Time from the first request to the quorum.
        elapsed: Duration,
        /// The ttl asked for.
        ttl: Duration,
        /// The clock drift allowance subtracted from the ttl.
        drift: Duration,
    },

    /// The lock is no longer held by this token: it expired, or the key now
    /// belongs to another holder. Returned by `extend` and `unlock` of a lost
    /// lock; nothing that belongs to another holder was touched.
    #[error("the lock on {resource:?} is no longer held by this token")]
    NotHeld {
        /// The resource name of the lost lock.
        resource: String,
    },

    /// The lock was lost while the work of
    /// [`Redlock::with_lock`](crate::Redlock::with_lock) ran; the work was
    /// dropped.
    #[error("the lock on {resource:?} was lost while the work ran: {reason}")]
    LockLost {
        /// The resource name of the lost lock.
        resource: String,
        /// Why it was lost.
        reason: LossReason,
    },

    /// Enough nodes were reachable for a quorum, but too many answered with an
    /// error that makes no sense for a lock: a key of another type
    /// (`WRONGTYPE`), a read-only replica (`READONLY`), a failed
    /// authentication, a script error.
    #[error("redis replied with errors on too many nodes for {resource:?} ({granted} of {required} required agreed); {}", NodeFailures(.failures))]
    Redis {
        /// The resource name asked for.
        resource: String,
        /// How many nodes agreed.
        granted: usize,
        /// How many nodes are needed for a quorum.
        required: usize,
        /// What each node that did not agree said.
        failures: Vec<NodeFailure>,
    },

    /// The node list given to the builder is empty.
    #[error("the node list is empty: a Redlock needs at least one Redis node")]
    EmptyNodeList,

    /// A node address could not be parsed.
    #[error("node {index} has an invalid address: {source}")]
    InvalidNodeAddress {
        /// Position of the address in the node list.
        index: usize,
        /// What redis-rs said about it.
        source: redis::RedisError,
    },

    /// The same node appears twice in the node list: it would be counted twice
    /// towards the quorum.
    #[error(
        "node {index} ({node}) duplicates node {first}: each node must be an independent Redis master"
    )]
    DuplicateNode {
        /// Position of the duplicate.
        index: usize,
        /// Position of its first occurrence.
        first: usize,
        /// The address, without credentials.
        node: String,
    },

    /// A builder setting is out of range.
    #[error("invalid setting `{setting}`: {reason}")]
    InvalidSetting {
        /// The builder method's name.
        setting: &'static str,
        /// What is wrong with the value.
        reason: &'static str,
    },

    /// The ttl is zero.
    #[error("the ttl is zero")]
    ZeroTtl,

    /// The ttl is not longer than the drift allowance, so no lock could ever
    /// have validity left.
    #[error("the ttl {ttl:?} is not longer than the clock drift allowance {drift:?}")]
    TtlNotAboveDrift {
        /// The ttl asked for.
        ttl: Duration,
        /// The drift allowance for it (ttl × drift_factor + 2 ms).
        drift: Duration,
    },

    /// The ttl is longer than Redis accepts for `PX`.
    #[error("the ttl {ttl:?} is longer than the largest supported ttl {max:?}")]
    TtlTooLarge {
        /// The ttl asked for.
        ttl: Duration,
        /// The largest ttl this crate sends to Redis.
        max: Duration,
    },

    /// The resource name is empty.
    #[error("the resource name is empty")]
    EmptyResource,

    /// The operating system's random number generator failed, so no token
    /// could be made.
    #[error("the operating system's random number generator failed: {0}")]
    Entropy(String),
}

/// What one node said when it did not agree.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeFailure {
    /// The node's address, without credentials.
    pub node: String,
    /// Why it did not agree.
    pub cause: NodeError,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.cause)
    }
}

/// Why one node did not agree in a quorum round.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum NodeError {
    /// The key is held there by another value (or, for extend and unlock, it
    /// is not ours there).
    Held,
    /// No answer within the node timeout.
    Timeout,
    /// The node could not be reached: connection refused, reset or closed.
    Unreachable(redis::RedisError),
    /// The node answered with an error: `WRONGTYPE`, `READONLY`, a failed
    /// authentication, a script error.
    Reply(redis::RedisError),
    /// The node answered with a value that no lock command returns.
    UnexpectedReply(String),
}

impl NodeError {
    /// Whether the node was unreachable (timeout or connection failure) rather
    /// than answering.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, NodeError::Timeout | NodeError::Unreachable(_))
    }

    pub(crate) fn from_redis(err: redis::RedisError) -> Self {
        // Connection-level failures mean "no answer"; anything the server
        // itself said (including authentication failures) is a reply.
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
        {
            NodeError::Unreachable(err)
        } else {
            NodeError::Reply(err)
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Held => f.write_str("held by another value"),
            NodeError::Timeout => f.write_str("timed out"),
            NodeError::Unreachable(e) => write!(f, "unreachable ({e})"),
            NodeError::Reply(e) => write!(f, "error reply ({e})"),
            NodeError::UnexpectedReply(v) => write!(f, "unexpected reply {v}"),
        }
    }
}

/// Formats a list of node failures on one line.
struct NodeFailures<'a>(&'a [NodeFailure]);

impl fmt::Display for NodeFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node failed");
        }
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}
