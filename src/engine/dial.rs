//! How a node is reached: what an entry of the node list names (a
//! standalone master or, with the feature `cluster`, a cluster by its
//! seeds), its label and addresses, and the redis-rs client made for it.

use redis::{Client, ConnectionInfo, RedisResult};

use crate::engine::config::Config;

/// What one entry of the node list names (made once per entry, at build:
/// its size does not matter).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    /// A standalone master.
    Single(ConnectionInfo),
    /// A cluster, by its seed masters.
    #[cfg(feature = "cluster")]
    Cluster(Vec<ConnectionInfo>),
}

/// The label of a node entry: `host:port` (see [`label`]), or for a
/// cluster `cluster(host:port,host:port)`. Never a password.
pub(crate) fn target_label(target: &Target) -> String {
    match target {
        Target::Single(info) => label(info),
        #[cfg(feature = "cluster")]
        Target::Cluster(seeds) => {
            let seeds: Vec<String> = seeds.iter().map(|s| s.addr().to_string()).collect();
            format!("cluster({})", seeds.join(","))
        }
    }
}

/// The addresses of a node entry, without databases: two entries that
/// share one are one server.
pub(crate) fn target_addrs(target: &Target) -> Vec<String> {
    match target {
        Target::Single(info) => vec![info.addr().to_string()],
        #[cfg(feature = "cluster")]
        Target::Cluster(seeds) => seeds.iter().map(|s| s.addr().to_string()).collect(),
    }
}

/// How a node is reached (one per node, never moved: its size does not
/// matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Dial {
    Single(Client),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster::ClusterClient),
}

/// The client of a standalone node (over TLS where its URL says so).
pub(crate) fn single_client(info: ConnectionInfo, config: &Config) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if let Some(tls) = &config.tls
        && matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
    {
        return Client::build_with_tls(info, tls.certificates());
    }
    let _ = config;
    Client::open(info)
}

/// The client of a cluster node. redis-rs routes each command to the master
/// that owns its key's slot, follows `MOVED` and `ASK`, and retries
/// `TRYAGAIN` (a slot half-way through a migration) and `CLUSTERDOWN` up to
/// eight times, 2 to 20 ms apart, within the node timeout (the round's own
/// timeout bounds the whole request; a node that does not answer in time
/// counts as not answering, never as a refusal). A cluster connection
/// whose requests time out twice in a row is made anew (see
/// `Node::timed_out`).
#[cfg(feature = "cluster")]
pub(crate) fn cluster_client(
    seeds: Vec<ConnectionInfo>,
    config: &Config,
) -> RedisResult<redis::cluster::ClusterClient> {
    let mut builder = redis::cluster::ClusterClientBuilder::new(seeds.clone())
        // Half the connect timeout for each seed and master: a silent one
        // (paused, or cut off) is given up in time for the others to make
        // the connection within the crate's own connect timeout.
        .connection_timeout(config.connect_timeout / 2)
        // An answer is awaited at most as long as the round would wait for
        // the largest request (the node timeout, plus its time per key).
        .response_timeout(
            config.node_timeout.saturating_add(
                crate::protocol::request::PER_KEY
                    .saturating_mul(u32::try_from(crate::MAX_RESOURCES).unwrap_or(u32::MAX)),
            ),
        )
        .retries(8)
        .min_retry_wait(2)
        .max_retry_wait(20);
    if let Some(first) = seeds.first() {
        let settings = first.redis_settings();
        if let Some(user) = settings.username() {
            builder = builder.username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder.password(password);
        }
    }
    builder.build()
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
