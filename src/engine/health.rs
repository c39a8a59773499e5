//! A per-node health report for a readiness endpoint: `Redlock::health`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Inner;
use crate::protocol::error::NodeError;
use crate::protocol::quorum::quorum;

/// One node's part of a [`Health`] report.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeHealth {
    /// The node's address, without credentials.
    pub node: String,
    /// Why the node could not be asked, if it could not.
    pub error: Option<NodeError>,
    /// The round trip of one `INFO` request (connecting not included).
    pub round_trip: Option<Duration>,
    /// `redis_version` (or `valkey_version`) as the server reports it.
    pub version: Option<String>,
    /// The server's `run_id`: it changes with every restart.
    pub run_id: Option<String>,
    /// `master` or `slave`, as the server reports its role.
    pub role: Option<String>,
    /// Whether the server writes an append-only file.
    pub appendonly: Option<bool>,
    /// Its `appendfsync` policy, when the user may read it (`CONFIG GET`).
    pub appendfsync: Option<String>,
}

impl NodeHealth {
    /// Whether the node answered.
    pub fn is_reachable(&self) -> bool {
        self.error.is_none()
    }
}

/// What [`Redlock::health`](crate::Redlock::health) found: each node, whether a quorum is
/// reachable, and the warnings a deployment should act on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Health {
    /// One entry per node, in the order given.
    pub nodes: Vec<NodeHealth>,
    /// Whether enough nodes answered as masters to make a quorum: the
    /// readiness answer. A replica in the node list answers but takes no
    /// writes, so it does not count.
    pub quorum_reachable: bool,
    /// What weakens the guarantees: a replica in the node list, a node
    /// without persistence, an even number of nodes. Each prints as a
    /// sentence (`Display`).
    pub warnings: Vec<HealthWarning>,
}

/// Something in the deployment that weakens the guarantees, found by
/// [`Redlock::health`](crate::Redlock::health).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HealthWarning {
    /// A node in the list is a replica: Redlock needs independent masters,
    /// and a replica takes no writes.
    Replica {
        /// The node's address, without credentials.
        node: String,
    },
    /// A node runs without AOF persistence: if it restarts, it forgets the
    /// locks it held (see the restart guard).
    NoPersistence {
        /// The node's address, without credentials.
        node: String,
    },
    /// An even number of nodes tolerates no more failures than one node
    /// fewer.
    EvenNodeCount {
        /// How many nodes the manager has.
        nodes: usize,
    },
}

impl std::fmt::Display for HealthWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HealthWarning::Replica { node } => write!(
                f,
                "{node} is a replica: Redlock needs independent masters (replication is not a quorum)"
            ),
            HealthWarning::NoPersistence { node } => write!(
                f,
                "{node} runs without AOF persistence: if it restarts, it forgets the locks it held"
            ),
            HealthWarning::EvenNodeCount { nodes } => write!(
                f,
                "{nodes} nodes: an even number tolerates no more failures than {}",
                nodes - 1
            ),
        }
    }
}

impl Inner {
    pub(crate) async fn health(self: &Arc<Self>) -> Health {
        let inner = self;
        let nodes = futures::future::join_all(inner.nodes.iter().map(|node| async move {
            let mut report = NodeHealth {
                node: node.label().to_owned(),
                error: None,
                round_trip: None,
                version: None,
                run_id: None,
                role: None,
                appendonly: None,
                appendfsync: None,
            };
            let mut conn = match node.connection().await {
                Ok(conn) => conn,
                Err(e) => {
                    report.error = Some(e);
                    return report;
                }
            };
            let asked = Instant::now();
            let info = crate::engine::node::info(
                &mut conn.conn,
                &["server", "persistence", "replication"],
            );
            match tokio::time::timeout(inner.config.node_timeout, info).await {
                Err(_) => report.error = Some(NodeError::Timeout),
                Ok(Err(e)) => report.error = Some(NodeError::from_redis(e)),
                Ok(Ok(info)) => {
                    report.round_trip = Some(asked.elapsed());
                    let field = |name: &str| {
                        info.lines().find_map(|l| {
                            l.strip_prefix(name)?
                                .strip_prefix(':')
                                .map(|v| v.trim().to_owned())
                        })
                    };
                    report.version = field("valkey_version").or_else(|| field("redis_version"));
                    report.run_id = field("run_id");
                    report.role = field("role");
                    report.appendonly = field("aof_enabled").map(|v| v == "1");
                    let mut fsync_cmd = redis::cmd("CONFIG");
                    fsync_cmd.arg("GET").arg("appendfsync");
                    let fsync = fsync_cmd.query_async::<Vec<String>>(&mut conn.conn);
                    if let Ok(Ok(pair)) =
                        tokio::time::timeout(inner.config.node_timeout, fsync).await
                    {
                        report.appendfsync = pair.get(1).cloned();
                    }
                }
            }
            report
        }))
        .await;

        // A replica answers but takes no writes: it cannot hold a lock, so
        // it does not count towards the quorum a readiness probe reports.
        let writable = nodes
            .iter()
            .filter(|n| n.is_reachable() && n.role.as_deref() != Some("slave"))
            .count();
        let mut warnings = Vec::new();
        for n in &nodes {
            if n.role.as_deref() == Some("slave") {
                warnings.push(HealthWarning::Replica {
                    node: n.node.clone(),
                });
            }
            if n.appendonly == Some(false) {
                warnings.push(HealthWarning::NoPersistence {
                    node: n.node.clone(),
                });
            }
        }
        if nodes.len().is_multiple_of(2) {
            warnings.push(HealthWarning::EvenNodeCount { nodes: nodes.len() });
        }
        Health {
            quorum_reachable: writable >= quorum(nodes.len()),
            nodes,
            warnings,
        }
    }
}
