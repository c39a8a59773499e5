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
    /// The client of the requests, and that of the waiting link's
    /// subscriptions.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster::ClusterClient, Box<Subscribing>),
}

/// The client of a cluster node's subscription connections (sharded
/// pub/sub, for [`crate::engine::wait`]): RESP3, whose messages arrive as
/// pushes, which redis-rs hands to the sender fixed when the client is
/// built. That sender relays them to the current session's receiver
/// ([`Subscribing::connect`]).
#[cfg(feature = "cluster")]
pub(crate) struct Subscribing {
    client: redis::cluster::ClusterClient,
    relay: Relay,
}

/// Where a cluster node's pushes go: the receiver of the link's current
/// session (none between sessions: they are dropped).
#[cfg(feature = "cluster")]
#[derive(Clone, Default)]
struct Relay(
    std::sync::Arc<std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>>>,
);

#[cfg(feature = "cluster")]
impl redis::aio::AsyncPushSender for Relay {
    fn send(&self, info: redis::PushInfo) -> Result<(), redis::aio::SendError> {
        let to = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match to.as_ref().map(|to| to.send(info)) {
            Some(Ok(())) => Ok(()),
            _ => Err(redis::aio::SendError),
        }
    }
}

#[cfg(feature = "cluster")]
impl Subscribing {
    /// The subscribing client of a cluster of `seeds`.
    pub(crate) fn new(seeds: Vec<ConnectionInfo>, config: &Config) -> RedisResult<Self> {
        let relay = Relay::default();
        let client = cluster_builder(seeds, config)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(relay.clone())
            .build()?;
        Ok(Subscribing { client, relay })
    }

    /// A new connection for one session of the link, and the receiver of
    /// its pushes (messages, subscription changes, disconnections). A
    /// later call takes the pushes over from the connection before.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped attempt leaves nothing behind.
    pub(crate) async fn connect(
        &self,
    ) -> RedisResult<(
        redis::cluster_async::ClusterConnection,
        tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    )> {
        let (to, pushes) = tokio::sync::mpsc::unbounded_channel();
        *self.relay.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(to);
        let conn = self.client.get_async_connection().await?;
        Ok((conn, pushes))
    }
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
    cluster_builder(seeds, config).build()
}

/// The builder of [`cluster_client`].
#[cfg(feature = "cluster")]
fn cluster_builder(
    seeds: Vec<ConnectionInfo>,
    config: &Config,
) -> redis::cluster::ClusterClientBuilder {
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
    builder
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
