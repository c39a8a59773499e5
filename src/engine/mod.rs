//! The engine: I/O and tasks. Everything here takes the manager's inner
//! state ([`Inner`]) and never the face ([`crate::api`]).
//!
//! - [`node`]: one node's connections (one per Tokio runtime), reconnection
//!   with the backoff of [`timing`], the server's identity, its
//!   [`silence`];
//! - [`round`]: the fan-out of one request to every node, and [`inflight`],
//!   which of a round's requests may still run;
//! - [`acquire`]: the attempt loop and the grant; [`extend`], [`verify`],
//!   [`release`] (the release round, its retry queue, the cleanup of a
//!   cancelled attempt), [`fence`] (fencing tokens);
//! - [`watchdog`]: the renewal task behind each guard;
//! - [`wait`]: waiting for a release (the waiter registry and the pub/sub
//!   link per node);
//! - [`counters`] and [`health`]: what the manager did, and the nodes'
//!   report;
//! - [`config`]: the settings the builder produces.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::Duration;

use crate::engine::config::Config;
use crate::engine::counters::Counters;
use crate::engine::node::Node;
use crate::engine::retries::Retries;
use crate::engine::wait::registry::Waits;
use crate::protocol::error::{Error, NodeError};
use crate::protocol::generation::Generation;
use crate::protocol::keys;
use crate::protocol::tally::Tally;
use crate::protocol::timing::{self, Ttl};
use crate::trace;

pub(crate) mod acquire;
pub(crate) mod call;
#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod config;
pub(crate) mod conn;
pub(crate) mod counters;
pub(crate) mod deferred;
pub(crate) mod dial;
pub(crate) mod extend;
pub(crate) mod fanout;
pub(crate) mod fence;
pub(crate) mod finisher;
pub(crate) mod health;
pub(crate) mod identities;
pub(crate) mod inflight;
pub(crate) mod lock;
pub(crate) mod node;
pub(crate) mod release;
pub(crate) mod retries;
pub(crate) mod round;
pub(crate) mod send;
pub(crate) mod silence;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod verify;
pub(crate) mod wait;
pub(crate) mod watchdog;

/// The most acquisition attempts of one manager's attempt loop in flight
/// at once; the others queue (first come, first served) before their round
/// starts, so their validity does not run while they wait.
///
/// An attempt in flight holds about 20 KB (each node's request and
/// redis-rs's state for it), and the allocator keeps the peak as resident
/// memory: 10,000 callers starting at once on held keys took 240 MB of
/// heap for a moment and kept 21 to 26 KB of resident memory per waiter
/// (`docs/waiting.md`, bench scenario 6e). 256 attempts at once make about
/// 5 MB. It does not slow that start (1.5 s either way): 256 requests queued
/// on a node's connection keep it busy (redis-rs's own queue to the socket
/// holds 50). It bounds a manager to 256 attempts per round trip: 5,000 a
/// second at 50 ms.
pub(crate) const ATTEMPTS_IN_FLIGHT: usize = 256;

/// The state of a manager, shared by its clones ([`crate::Redlock`] holds
/// an `Arc` of it) and held weakly by its background tasks.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) config: Config,
    /// Admission for the watchdogs' renewals; see `renew_concurrency`.
    pub(crate) renewals: tokio::sync::Semaphore,
    /// Admission for the acquisition attempts of the attempt loop: at most
    /// [`ATTEMPTS_IN_FLIGHT`] at once.
    pub(crate) attempts: tokio::sync::Semaphore,
    /// Releases owed to nodes that could not be reached.
    pub(crate) retries: Retries,
    /// Set once a round found two entries of the node list on one server.
    pub(crate) misconfigured: OnceLock<Error>,
    /// Set once every node was tried once; see [`Inner::warm_up`].
    pub(crate) warmed: tokio::sync::OnceCell<()>,
    /// What the manager did; see [`Redlock::stats`](crate::Redlock::stats).
    pub(crate) stats: Counters,
    /// The generation markers and the restart guard.
    pub(crate) generation: Generation,
    /// The waiters and the release subscriptions; see [`wait`].
    pub(crate) waits: Waits,
    /// Extension rounds still in flight, for the handles that do not know
    /// them; see [`Extensions`](inflight::Extensions).
    pub(crate) extensions: inflight::Extensions,
    /// Finishes the requests a round left pending at a quorum; see
    /// [`finisher`].
    pub(crate) finishers: finisher::Finishers,
}

impl Inner {
    /// Remembers a configuration error; every later call fails with it.
    pub(crate) fn misconfigure(&self, error: Error) {
        if self.misconfigured.get().is_none() {
            trace::error!(%error, "the node list names one server twice; every call will fail");
            let _ = self.misconfigured.set(error);
        }
    }

    /// Before the first round of a manager, connects to every node at once
    /// and waits until each connected or failed (each bounded by the connect
    /// timeout), but no longer than the node timeout once a quorum of them
    /// connected: the others go on connecting in the background. A cold
    /// start then costs one parallel connect instead of counting against the
    /// node timeout, and a node that is paused or cut off (whose connection
    /// takes the whole connect timeout to fail) holds up the first call of
    /// a fresh process by the node timeout, not the connect timeout.
    ///
    /// Each node's identity is checked as its connection is made, before it
    /// takes any request, so no call counts a server named twice; the call
    /// that finds it fails with `DuplicateNode`, and every later one: the
    /// first call, unless one of the two entries connects more than the
    /// node timeout after a quorum did.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped warm-up is started again by the next round
    /// (connections made meanwhile stay made).
    pub(crate) async fn warm_up(&self) {
        self.warmed
            .get_or_init(|| async {
                let mut connecting: futures::stream::FuturesUnordered<_> = self
                    .nodes
                    .iter()
                    .enumerate()
                    .map(|(index, node)| {
                        let node = node.clone();
                        async move { (index, node.connection().await) }
                    })
                    .collect();
                #[cfg(feature = "cluster")]
                if self.generation.guard.is_some() {
                    crate::engine::cluster::make_markers(&self.nodes, &self.generation);
                }
                let quorum = crate::protocol::quorum::quorum(self.nodes.len());
                let mut connected = 0;
                let mut heard = vec![false; self.nodes.len()];
                while let Some((index, made)) = futures::StreamExt::next(&mut connecting).await {
                    connected += usize::from(made.is_ok());
                    heard[index] = true;
                    self.warmed_node(index, made);
                    if connected >= quorum {
                        break;
                    }
                }
                // The others get the node timeout more: a healthy node (a
                // server named twice, say) connects within it.
                let grace = tokio::time::sleep(self.config.node_timeout);
                tokio::pin!(grace);
                while !connecting.is_empty() {
                    tokio::select! {
                        biased;
                        next = futures::StreamExt::next(&mut connecting) => {
                            if let Some((index, made)) = next {
                                heard[index] = true;
                                self.warmed_node(index, made);
                            }
                        }
                        () = &mut grace => break,
                    }
                }
                // A node still connecting took longer than a request may:
                // silent, so that a release does not wait out its connect
                // timeout (its connection, once made, ends that).
                for (node, _) in self.nodes.iter().zip(heard).filter(|(_, heard)| !heard) {
                    node.silence.timed_out();
                }
                if !connecting.is_empty() {
                    // The slower nodes' connections are made (or fail) in
                    // the background; a round that needs one meanwhile
                    // waits for it (one attempt at a time per node).
                    let nodes = self.nodes.clone();
                    self.finishers.finish(async move {
                        while let Some((index, made)) =
                            futures::StreamExt::next(&mut connecting).await
                        {
                            if made.is_ok() {
                                warn_without_persistence(&nodes[index]);
                            }
                        }
                    });
                }
            })
            .await;
    }

    /// What the warm-up learned of node `index` by connecting to it.
    fn warmed_node(&self, index: usize, made: Result<node::Conn, NodeError>) {
        let node = &self.nodes[index];
        match made {
            Err(NodeError::SameServer {
                other_index,
                other_node,
            }) => self.misconfigure(Error::DuplicateNode {
                index,
                node: node.label().to_owned(),
                first: other_index,
                first_node: other_node,
            }),
            Ok(_) => warn_without_persistence(node),
            Err(_) => {}
        }
    }

    /// The Redis key of a resource.
    pub(crate) fn key(&self, resource: &str) -> String {
        keys::lock_key(&self.config.key_prefix, resource)
    }

    /// Fails with the configuration error a round found, if any.
    pub(crate) fn configured(&self) -> Result<(), Error> {
        match self.misconfigured.get() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Remembers a configuration error a round found.
    pub(crate) fn note(&self, tally: &Tally) {
        if let Some(error) = tally.same_server_error() {
            self.misconfigure(error);
        }
    }

    /// Validates the arguments of an acquisition.
    pub(crate) fn check(&self, resources: &[&str], ttl: Duration) -> Result<Ttl, Error> {
        self.configured()?;
        keys::check_resources(resources)?;
        self.ttl(ttl)
    }

    /// Validates a ttl, including against the restart guard's `max_ttl`.
    pub(crate) fn ttl(&self, ttl: Duration) -> Result<Ttl, Error> {
        timing::checked_ttl(ttl, self.config.drift_factor, self.generation.guard)
    }

    /// The renewal interval for a ttl: the configured one, or ttl / 3.
    pub(crate) fn renew_interval(&self, ttl: Duration) -> Result<Duration, Error> {
        let config = &self.config;
        timing::renew_interval(ttl, config.drift_factor, config.renew_interval)
    }
}

/// Warns when `node` runs without AOF persistence (as its `INFO` said).
fn warn_without_persistence(node: &Node) {
    if node.persistent() == Some(false) {
        trace::warning!(
            node = node.label(),
            "the node runs without AOF persistence: if it restarts, it forgets \
             the locks it held; run it with appendonly yes and appendfsync \
             always, or delay its restarts past the largest ttl"
        );
    }
}
