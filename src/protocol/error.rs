//! The crate's one error type and the per-node causes it carries.

use std::fmt;
use std::time::Duration;

pub use crate::protocol::loss::LossReason;

/// Everything that can go wrong when building a [`Redlock`](crate::Redlock)
/// or taking, extending and releasing a lock.
///
/// [`kind`](Error::kind) sorts the variants (held elsewhere, unavailable,
/// lost, refused, configuration, arguments);
/// [`is_retryable`](Error::is_retryable) and
/// [`is_held_elsewhere`](Error::is_held_elsewhere) answer the two questions
/// callers ask most.
///
/// Variants that come from a quorum round carry the numbers a caller needs to
/// understand it: how many nodes agreed, how many were required, and what each
/// failing node said.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock is held by someone else: another holder's value was found on
    /// so many nodes that it has, or may have, a quorum (the nodes it holds
    /// plus the nodes that did not answer reach one). Also returned when
    /// contenders kept sharing the nodes between them through every
    /// split-vote round of one attempt.
    #[error(
        "resource {resource:?} is locked by another holder: {held} of {nodes} nodes answered that another value holds it ({required} make a quorum); {}", NodeFailures(.failures)
    )]
    Conflict {
        /// The resource name asked for.
        resource: String,
        /// How many nodes answered that another value holds the key, counted
        /// until the outcome of the round was certain.
        held: usize,
        /// How many nodes are needed for a quorum.
        required: usize,
        /// How many nodes the manager has.
        nodes: usize,
        /// What each node that did not agree said (a held key, a timeout, an
        /// error), so that a node that is down is visible here too.
        failures: Vec<NodeFailure>,
    },

    /// Too few nodes could be reached (they timed out, refused the connection
    /// or dropped it, or answered that they are busy or loading) for a quorum
    /// to agree, and no other holder can have one.
    #[error("no quorum for {resource:?}: {granted} nodes counted, {required} needed; {}", NodeFailures(.failures))]
    NoQuorum {
        /// The resource name asked for.
        resource: String,
        /// How many nodes had agreed when the outcome of the round was
        /// certain (the round stops listening then).
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

    /// So many nodes answered with an error that retrying cannot fix that no
    /// quorum is possible: a key of another type (`WRONGTYPE`), a read-only
    /// replica (`READONLY`), a user without the permission (`NOPERM`), a
    /// failed authentication, a script error. Not retried.
    #[error("redis replied with errors on too many nodes for {resource:?} ({granted} nodes counted, {required} needed); {}", NodeFailures(.failures))]
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

    /// A node address could not be read.
    #[error("node {index} ({entry}) is not a valid address: {reason}")]
    InvalidNodeAddress {
        /// Position of the address in the node list.
        index: usize,
        /// The entry as given, with any password replaced by `***`.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Two entries of the node list reach the same server: the same address
    /// twice, two names of one server, or two databases of one server (one
    /// failure domain all the same). It would count twice towards the
    /// quorum. Detected by address when the manager is built, and by the
    /// server's `run_id` when the second entry connects; from then on every
    /// operation of the manager fails with it.
    #[error(
        "node {index} ({node}) and node {first} ({first_node}) are the same Redis server: each node must be an independent Redis master"
    )]
    DuplicateNode {
        /// Position of the later entry.
        index: usize,
        /// Its address, without credentials.
        node: String,
        /// Position of the earlier entry.
        first: usize,
        /// Its address, without credentials.
        first_node: String,
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

    /// The ttl asked of [`Redlock::acquire`](crate::Redlock::acquire) leaves
    /// no room for renewals at the default interval (a third of the ttl):
    /// it must be at least three times the drift allowance, plus a little.
    #[error(
        "the ttl {ttl:?} is too short for a renewing guard: renewals every ttl/3 need ttl/3 to be shorter than the ttl minus the drift allowance {drift:?}"
    )]
    TtlTooShortToRenew {
        /// The ttl asked for.
        ttl: Duration,
        /// The drift allowance for it.
        drift: Duration,
    },

    /// The ttl is longer than the restart guard's `max_ttl`
    /// ([`RedlockBuilder::restart_guard`](crate::RedlockBuilder::restart_guard)):
    /// the guard protects only locks no longer than it.
    #[error(
        "the ttl {ttl:?} is longer than the restart guard's max_ttl {max_ttl:?}; raise max_ttl on every client of these nodes, or use a shorter ttl"
    )]
    TtlAboveRestartGuard {
        /// The ttl asked for.
        ttl: Duration,
        /// The guard's `max_ttl`.
        max_ttl: Duration,
    },

    /// [`Redlock::fencing_token`](crate::Redlock::fencing_token) could not
    /// prove that the number it would give is larger than every earlier
    /// token: too many of the nodes that answered have an untrusted counter
    /// (missing, bare, or from an earlier generation: a node that lost its
    /// data, or the first tokens on brand-new nodes), or too few answered.
    /// It fails closed rather than risk a repeat. Ask again once more nodes
    /// answer; a token made while every node answers trusts the nodes whose
    /// markers are a few seconds old.
    #[error(
        "fencing token for {resource:?} not proven: {answered} of {nodes} nodes answered with their counter, {untrusted} of them untrusted (missing, bare or from an earlier generation: a node that lost its data, or brand-new nodes); more trusted nodes must answer, or every node, which then trusts the nodes whose markers are a few seconds old; {}",
        NodeFailures(.failures)
    )]
    FencingUnproven {
        /// The resource.
        resource: String,
        /// Nodes whose counters were read (not too young under the restart
        /// guard).
        answered: usize,
        /// How many of them had an untrusted counter.
        untrusted: usize,
        /// Nodes in the cluster.
        nodes: usize,
        /// What each node that did not count said.
        failures: Vec<NodeFailure>,
    },

    /// The resource name is empty.
    #[error("the resource name is empty")]
    EmptyResource,

    /// A lock on several resources was asked for with an empty list.
    #[error("the list of resources is empty")]
    NoResources,

    /// A lock on several resources named one resource twice.
    #[error("resource {resource:?} is named twice in one request")]
    DuplicateResource {
        /// The resource named twice.
        resource: String,
    },

    /// A lock on several resources named more than
    /// [`MAX_RESOURCES`](crate::MAX_RESOURCES).
    #[error("{count} resources in one request; at most {max} are allowed")]
    TooManyResources {
        /// How many resources were named.
        count: usize,
        /// The limit.
        max: usize,
    },

    /// [`Redlock::adopt`](crate::Redlock::adopt) was given a token no
    /// holder can have: an empty one.
    #[error("invalid token to adopt: {reason}")]
    InvalidToken {
        /// What is wrong with it.
        reason: &'static str,
    },

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
///
/// Which failures a retry can fix: [`Timeout`](NodeError::Timeout),
/// [`Silent`](NodeError::Silent), [`Unreachable`](NodeError::Unreachable), [`Busy`](NodeError::Busy) and
/// [`NotDurable`](NodeError::NotDurable) say nothing certain about the key,
/// and `lock` retries them like a conflict; a [`Young`](NodeError::Young)
/// node is not counted, and retried, until its data is old enough.
/// [`Reply`](NodeError::Reply), [`UnexpectedReply`](NodeError::UnexpectedReply),
/// [`Tls`](NodeError::Tls), [`Durability`](NodeError::Durability) and
/// [`SameServer`](NodeError::SameServer) will not change by retrying;
/// when they leave no quorum possible, the call fails at once.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum NodeError {
    /// The key is held there by another value.
    Held,
    /// The key is not ours there (extend, unlock, fencing): missing, expired,
    /// or held by another value.
    NotOurs,
    /// No answer within the node timeout, or no connection within the
    /// connect timeout.
    Timeout,
    /// Not waited for by a release that was `Ok` without it: the node's last
    /// request timed out and nothing was heard from it since (paused,
    /// blackholed, or slower than the node timeout). The release still goes
    /// to it in the background, and is owed to it until the keys expire
    /// ([`Redlock::pending_releases`](crate::Redlock::pending_releases)).
    /// Retried like a timeout.
    Silent,
    /// The node could not be reached: connection refused, reset or closed.
    Unreachable(redis::RedisError),
    /// The node answered that it cannot serve the request now: `BUSY` (a
    /// long script), `LOADING` (a restart loading its data), `TRYAGAIN`,
    /// `MASTERDOWN`, `CLUSTERDOWN`. Retried like an unreachable node.
    Busy(redis::RedisError),
    /// The node answered with an error that retrying cannot fix:
    /// `WRONGTYPE`, `READONLY`, `NOPERM`, a failed authentication, a script
    /// error.
    Reply(redis::RedisError),
    /// The node answered with a value that no lock command returns.
    UnexpectedReply(String),
    /// The TLS handshake failed: the node's certificate is not trusted (a
    /// wrong CA, an expired or mismatched certificate), it wants a client
    /// certificate that was not given, or it sent a TLS alert (it does not
    /// trust our client certificate, say). Retrying cannot fix it.
    Tls(redis::RedisError),
    /// The node agreed, but its data is younger than the restart guard's
    /// `max_ttl` (see
    /// [`RedlockBuilder::restart_guard`](crate::RedlockBuilder::restart_guard)):
    /// it restarted without its data, or is new, and does not count towards
    /// a quorum until its data is `max_ttl` old, on its own clock.
    Young {
        /// The age of the node's data (its generation marker), on its clock.
        age: Duration,
        /// The restart guard's `max_ttl`: the node counts at that age.
        max_ttl: Duration,
    },
    /// The node took the write but did not confirm its durability in time
    /// ([`Durability`](crate::Durability)): `WAITAOF` or `WAIT` timed out.
    /// Counted as not answering, and retried.
    NotDurable,
    /// The node cannot confirm durability at all: `WAITAOF` is unknown there
    /// (Redis before 7.2), or AOF is off, or `WAIT` is refused. A
    /// configuration error, not retried; the write it may have taken is
    /// released.
    Durability(redis::RedisError),
    /// This entry of the node list reaches the same server as another one.
    SameServer {
        /// Position of the other entry.
        other_index: usize,
        /// Its address, without credentials.
        other_node: String,
    },
    /// The node cannot do this at all: a cluster node asked for what needs
    /// keys in other slots than the lock key's (fencing), say. Not retried.
    Unsupported(&'static str),
}

/// Whether a connection failed in the TLS handshake: over a certificate (the
/// node's, or a client certificate it asked for), or by a TLS alert the node
/// sent (`received fatal alert: UnknownCA` when it does not trust our client
/// certificate, say). rustls's errors reach us as I/O errors, named in their
/// text; a plain connection's errors never contain these words.
fn is_tls_failure(err: &redis::RedisError) -> bool {
    let text = err.to_string();
    text.contains("certificate")
        || text.contains("CertificateRequired")
        || text.contains("fatal alert")
        || text.contains("peer sent no certificates")
}

/// The error codes a server sends when it cannot serve a request for now.
/// A cluster's redirections (`MOVED`, `ASK`) are among them: redis-rs
/// follows them, and one that still reaches us (a slot moving twice within
/// its retries) says nothing about the key.
const TRANSIENT_CODES: [&str; 7] = [
    "BUSY",
    "LOADING",
    "TRYAGAIN",
    "MASTERDOWN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
];

impl NodeError {
    /// Whether the node was unreachable (timeout or connection failure) rather
    /// than answering.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            NodeError::Timeout | NodeError::Silent | NodeError::Unreachable(_)
        )
    }

    /// Whether what the node holds is unknown and a retry may succeed: it was
    /// unreachable, or answered that it is busy.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            NodeError::Timeout
                | NodeError::Silent
                | NodeError::Unreachable(_)
                | NodeError::Busy(_)
                | NodeError::NotDurable
        )
    }

    pub(crate) fn from_redis(err: redis::RedisError) -> Self {
        // Connection-level failures mean "no answer"; anything the server
        // itself said (including authentication failures) is a reply.
        if is_tls_failure(&err) {
            NodeError::Tls(err)
        } else if err.kind() == redis::ErrorKind::ClusterConnectionNotFound {
            // A cluster whose connection to the slot's master is gone.
            NodeError::Unreachable(err)
        } else if err.to_string().contains("authentication failed") {
            // What a cluster client reports for a wrong password (a
            // standalone node's reply already lands below as a reply).
            NodeError::Reply(err)
        } else if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_timeout()
        {
            NodeError::Unreachable(err)
        } else if err
            .code()
            .is_some_and(|code| TRANSIENT_CODES.contains(&code))
        {
            NodeError::Busy(err)
        } else {
            NodeError::Reply(err)
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Held => f.write_str("held by another value"),
            NodeError::NotOurs => f.write_str("not ours there"),
            NodeError::Timeout => f.write_str("timed out"),
            NodeError::Silent => f.write_str(
                "not waited for: it did not answer its last request in time \
                 (the release goes to it in the background, and is retried until the keys expire)",
            ),
            NodeError::Unreachable(e) => write!(f, "unreachable ({e})"),
            NodeError::Busy(e) => write!(f, "busy ({e})"),
            NodeError::Reply(e) if matches!(e.code(), Some("MOVED" | "ASK")) => write!(
                f,
                "error reply ({e}): the node is a shard of a Redis Cluster; give the whole \
                 cluster as one node, redis+cluster://host:port,host:port (feature `cluster`)"
            ),
            NodeError::Reply(e) => write!(f, "error reply ({e})"),
            NodeError::UnexpectedReply(v) => write!(f, "unexpected reply {v}"),
            NodeError::Tls(e) => write!(f, "TLS handshake failed ({e})"),
            NodeError::NotDurable => f.write_str(
                "took the write but did not confirm it durable in time \
                 (for Durability::Replicas: are that many replicas connected to it?)",
            ),
            NodeError::Durability(e) if e.code() == Some("NOPERM") => write!(
                f,
                "cannot confirm durability ({e}): the user's ACL needs +waitaof (or +wait)"
            ),
            NodeError::Durability(e) => write!(
                f,
                "cannot confirm durability ({e}): WAITAOF needs Redis 7.2 or later, or Valkey, with appendonly yes"
            ),
            NodeError::Young { age, max_ttl } => write!(
                f,
                "not counted: it agreed, but its data is only {age:?} old (it restarted empty, or is new): \
                 the restart guard counts it once it is {max_ttl:?} old, in {:?}",
                max_ttl.saturating_sub(*age)
            ),
            NodeError::SameServer {
                other_index,
                other_node,
            } => write!(f, "the same server as node {other_index} ({other_node})"),
            NodeError::Unsupported(what) => write!(f, "not supported: {what}"),
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NodeError::Unreachable(e)
            | NodeError::Busy(e)
            | NodeError::Reply(e)
            | NodeError::Durability(e)
            | NodeError::Tls(e) => Some(e),
            _ => None,
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
