//! One Redis node: its address and its long-lived connection.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, ConnectionInfo, RedisResult};

/// A node of the Redlock quorum.
///
/// The connection is a [`ConnectionManager`]: one multiplexed connection that
/// many requests share at once and that reconnects on its own after the node
/// restarts. It is made on first use rather than in the (synchronous) builder,
/// because creating one needs a Tokio runtime; after that every request clones
/// it, which is an `Arc` clone, so there is no lock on the hot path.
pub(crate) struct Node {
    label: String,
    client: Client,
    config: ConnectionManagerConfig,
    conn: OnceLock<ConnectionManager>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.label)
            .field("connected", &self.conn.get().is_some())
            .finish()
    }
}

impl Node {
    pub(crate) fn new(info: ConnectionInfo, node_timeout: Duration) -> RedisResult<Self> {
        let label = label(&info);
        let client = Client::open(info)?;
        // The quorum round bounds every request by `node_timeout` itself, so
        // the manager gets no response timeout. Reconnection is not retried
        // inside the manager: a failed connection surfaces as a failed request
        // at once, and the next request starts a fresh attempt, so a node that
        // comes back is used again at the next round.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(node_timeout.max(Duration::from_secs(1))))
            .set_response_timeout(None);
        Ok(Node {
            label,
            client,
            config,
            conn: OnceLock::new(),
        })
    }

    /// The address, without credentials, for error messages.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The node's connection, created on first use. Must run inside a Tokio
    /// runtime.
    pub(crate) fn connection(&self) -> RedisResult<ConnectionManager> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn.clone());
        }
        let fresh =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())?;
        // Two callers may race here; the loser's (unconnected) manager is dropped.
        Ok(self.conn.get_or_init(|| fresh).clone())
    }
}

/// `host:port`, plus `/db` when the database is not 0. Never the password.
pub(crate) fn label(info: &ConnectionInfo) -> String {
    let db = info.redis_settings().db();
    if db == 0 {
        info.addr().to_string()
    } else {
        format!("{}/{db}", info.addr())
    }
}
