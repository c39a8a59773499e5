//! The connection a request rides on: a standalone node's multiplexed
//! connection, or (feature `cluster`) a cluster node's cluster connection,
//! which routes each command to the master that owns its key's slot and
//! follows `MOVED` and `ASK` itself.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::protocol::server_info::sections_refused;

/// One node's connection; cheap to clone (each variant is a handle to a
/// shared driver task).
#[derive(Clone)]
pub(crate) enum NodeConn {
    /// A standalone master.
    Single(MultiplexedConnection),
    /// A Redis Cluster or Valkey Cluster.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl NodeConn {
    /// Whether this is a cluster node's connection.
    pub(crate) fn is_cluster(&self) -> bool {
        match self {
            NodeConn::Single(_) => false,
            #[cfg(feature = "cluster")]
            NodeConn::Cluster(_) => true,
        }
    }

    /// Sends a keyless command that asks about one server (`INFO`,
    /// `CONFIG GET`): to the node itself, or to one master of a cluster
    /// (redis-rs would otherwise ask every node and answer with a map).
    ///
    /// # Cancel safety
    /// Cancel-safe: the commands sent this way only read.
    pub(crate) async fn ask_one<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            NodeConn::Single(conn) => cmd.query_async(conn).await,
            #[cfg(feature = "cluster")]
            NodeConn::Cluster(conn) => {
                use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
                let value = conn
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
                    )
                    .await?;
                // A server's error reply comes back as a value here (Redis
                // 6.2 refuses `INFO` with two sections): the caller must
                // see the error itself.
                if let Value::ServerError(error) = value {
                    return Err(error.into());
                }
                Ok(redis::from_redis_value(value)?)
            }
        }
    }
}

impl NodeConn {
    /// What names the server (or the cluster) behind this connection among
    /// the node list's entries: a standalone server's `run_id` (from `info`,
    /// its `INFO server`), a cluster's [`cluster_identity`](crate::protocol::server_info::cluster_identity); empty when
    /// unknown.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub(crate) async fn identity(&mut self, info: &str) -> String {
        if !self.is_cluster() {
            return crate::protocol::server_info::run_id(info).unwrap_or_default();
        }
        let slots = redis::cmd("CLUSTER").arg("SLOTS").clone();
        match self.ask_one::<Value>(&slots).await {
            Ok(slots) => crate::protocol::server_info::cluster_identity(&slots).unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            NodeConn::Single(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            NodeConn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            NodeConn::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            NodeConn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            NodeConn::Single(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            NodeConn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// `INFO` of `sections`, in one request; from a server that takes one
/// section at a time (Redis before 7.0), its default `INFO`, which holds
/// the server, persistence and replication sections.
///
/// # Cancel safety
/// Cancel-safe: it only reads.
pub(crate) async fn info(conn: &mut NodeConn, sections: &[&str]) -> RedisResult<String> {
    let mut cmd = redis::cmd("INFO");
    for section in sections {
        cmd.arg(*section);
    }
    match conn.ask_one(&cmd).await {
        Err(e) if sections.len() > 1 && sections_refused(&e) => {
            conn.ask_one(&redis::cmd("INFO")).await
        }
        other => other,
    }
}
