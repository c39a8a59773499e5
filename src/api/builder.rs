//! The builder of a `Redlock`: its settings, their defaults and their
//! validation.

use std::sync::Arc;
use std::time::Duration;

use crate::api::address::NodeAddress;
use crate::api::address::Target;
use crate::api::address::sealed::Sealed;

use crate::api::redlock::Redlock;
use crate::engine::Inner;
use crate::engine::config::Config;
use crate::engine::lock::new_token;
use crate::engine::node::{Identities, Node, target_addrs, target_label};
use crate::engine::retries::Retries;
use crate::protocol::durability::Durability;
use crate::protocol::error::Error;
use crate::protocol::generation::Generation;
use crate::protocol::keys;
use crate::protocol::timing::LEASE;
use crate::trace;

/// Default number of retries after the first attempt.
pub const DEFAULT_RETRY_COUNT: u32 = 10;
/// Default pause between attempts.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
/// Default upper bound of the random jitter added to the pause.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
/// Default bound on each request to one node.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default bound on making a connection to one node.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Default bound on renewals in flight at once per manager.
pub const DEFAULT_RENEW_CONCURRENCY: usize = 256;
/// Default clock drift factor.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

/// Configures a [`Redlock`]. Made by [`Redlock::builder`].
///
/// Each setting documents its default; [`build`](RedlockBuilder::build)
/// validates them all and connects to nothing, so it needs neither a
/// runtime nor nodes that are up.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use redlock_quorum::{Error, Redlock};
///
/// let redlock = Redlock::builder([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])
/// // Short, contended critical sections: poll often.
/// .retry_delay(Duration::from_millis(5))
/// .retry_jitter(Duration::from_millis(5))
/// // Nodes across a data centre: more room per request and per connect.
/// .node_timeout(Duration::from_millis(100))
/// .connect_timeout(Duration::from_secs(1))
/// .key_prefix("locks:")
/// .build()?;
/// assert_eq!(redlock.quorum(), 2);
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedlockBuilder {
    nodes: Vec<Result<Target, (String, String)>>,
    config: Config,
}

impl RedlockBuilder {
    pub(crate) fn new<I>(nodes: I) -> Self
    where
        I: IntoIterator,
        I::Item: NodeAddress,
    {
        RedlockBuilder {
            nodes: nodes.into_iter().map(Sealed::resolve).collect(),
            config: Config {
                retry_count: DEFAULT_RETRY_COUNT,
                retry_delay: DEFAULT_RETRY_DELAY,
                retry_jitter: DEFAULT_RETRY_JITTER,
                node_timeout: DEFAULT_NODE_TIMEOUT,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                drift_factor: DEFAULT_DRIFT_FACTOR,
                key_prefix: String::new(),
                renew_interval: None,
                max_hold: None,
                renew_concurrency: DEFAULT_RENEW_CONCURRENCY,
                restart_guard: None,
                durability: Durability::Memory,
                stats: true,
                #[cfg(feature = "tls")]
                tls: None,
            },
        }
    }

    /// Timed retries after the first attempt in [`Redlock::lock`]: those
    /// that no release notification woke. A waiter also gives up once it
    /// slept as long as this many pauses (`retry_delay + retry_jitter`)
    /// could take. Defaults to 10.
    pub fn retry_count(mut self, retries: u32) -> Self {
        self.config.retry_count = retries;
        self
    }

    /// The pause of the timed retry: between attempts where a release cannot
    /// be notified (pub/sub denied, a node down, a broken subscription), and
    /// for the first waiter of each key in a manager, the safety net for
    /// releases nobody publishes. Defaults to 200 ms.
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// The upper bound of a random jitter added to each pause, so that
    /// clients that failed together do not retry together. Defaults to
    /// 100 ms.
    pub fn retry_jitter(mut self, jitter: Duration) -> Self {
        self.config.retry_jitter = jitter;
        self
    }

    /// The bound on each request to one node, once connected. A node that
    /// does not answer within it counts as unknown for that round. Keep it
    /// well under the ttls you use. Defaults to 50 ms; must not be zero.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// The bound on making a connection to one node (TCP, authentication,
    /// and one `INFO server` to learn which server it is). Apart from
    /// [`node_timeout`](RedlockBuilder::node_timeout), so that many fresh
    /// clients connecting at once (a cold start, a cron job firing on every
    /// instance) are not taken for slow nodes. The time still comes off the
    /// validity of a lock whose round waited for it. Defaults to 500 ms;
    /// must not be zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// The clock drift factor: the validity of a lock is reduced by
    /// `ttl × drift_factor + 2 ms` to allow for nodes whose clocks run
    /// faster than ours. Defaults to 0.01; must be finite and in `[0, 1)`.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// A prefix put before every resource name to form the Redis key.
    /// Defaults to none: the key is the resource name, as in the reference
    /// Redlock clients of other languages, so a mixed fleet excludes each
    /// other on the same keys.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// How often a [`LockGuard`](crate::LockGuard) renews its lock. Defaults
    /// to a third of the lock's ttl, which leaves two more chances to renew
    /// before the lock expires. Must be shorter than the ttl minus the drift
    /// allowance of each lock acquired with [`Redlock::acquire`] (checked
    /// there), and longer than zero (checked by `build`); a failed renewal
    /// is retried after `retry_delay` (or the interval, if shorter).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.config.renew_interval = Some(interval);
        self
    }

    /// The longest a [`LockGuard`](crate::LockGuard) keeps renewing. After
    /// it, renewal stops and the guard reports the lock lost
    /// ([`LossReason::MaxHold`](crate::LossReason::MaxHold)), so that a
    /// holder stuck in a loop cannot keep a resource forever; the Redlock
    /// spec asks for such a limit to keep the system live. Defaults to no
    /// limit.
    pub fn max_hold(mut self, limit: Duration) -> Self {
        self.config.max_hold = Some(limit);
        self
    }

    /// How many [`LockGuard`](crate::LockGuard) renewals of this manager may
    /// be in flight at once; the others wait their turn (within their
    /// validity). Thousands of guards renewing in the same instant would
    /// otherwise queue so many requests that each one times out. Defaults
    /// to 256; must not be zero.
    pub fn renew_concurrency(mut self, limit: usize) -> Self {
        self.config.renew_concurrency = limit;
        self
    }

    /// Turns on the restart guard: a node whose data is younger than
    /// `max_ttl`, measured on the node's own clock, does not count towards
    /// any quorum (acquire, extend, fencing). A node that restarted without
    /// its data (no persistence, or a lost disk) therefore cannot help a
    /// second client to a quorum while an earlier lock it forgot may still
    /// be valid. This is the client-side equivalent of delaying every
    /// restart past the largest ttl, with no operator involved.
    ///
    /// `max_ttl` must be at least the largest ttl that any client uses on
    /// these nodes; this manager refuses a lock with a longer ttl
    /// ([`Error::TtlAboveRestartGuard`]). Every client of the nodes should
    /// set the guard with the same `max_ttl`.
    ///
    /// How a node's age is known: each node keeps a *generation marker*, a
    /// key without expiry (the key prefix, the byte `0xFF`, `generation`)
    /// holding the node's `TIME` when it was made and a random id. A node
    /// that lost its data lost the marker too, and the next request makes a
    /// new one, born then.
    ///
    /// The cost: acquisition and extension run a Lua script that reads the
    /// marker and the node's `TIME` instead of a plain `SET` (one round
    /// trip still); once the manager has seen a node's marker old, the
    /// acquisition of one key there is the `SET` with the marker's `GET`
    /// behind it in one pipeline (standalone nodes of Redis 7.0 or later,
    /// without [`durability`](Self::durability); see the README's
    /// benchmark figures for the price). A brand-new
    /// cluster (no marker yet) grants no lock until `max_ttl` after the first
    /// request of any guarded client. Off by default, so that a fleet mixing
    /// this crate with other Redlock clients keeps its plain `SET`s. The
    /// assumptions are the model checker's (README, "What the model checker
    /// shows"): a node keeps all its data or loses all of it, fewer than
    /// half the nodes lose their data at once, and no key is evicted.
    ///
    /// Must be longer than its own clock drift allowance (`max_ttl ×
    /// drift_factor + 2 ms`, so that some ttl fits under it) and at most
    /// [`MAX_TTL`](crate::MAX_TTL); `build` refuses it otherwise
    /// ([`Error::InvalidSetting`]).
    ///
    /// A node that does not count yet shows only in a failed call's error
    /// ([`NodeError::Young`](crate::NodeError::Young) among its failures):
    /// [`Redlock::health`](crate::Redlock::health) checks reachability and
    /// configuration, not the markers' ages, and
    /// [`stats`](crate::Redlock::stats)' `node_failures` counts timeouts,
    /// errors and failed connections only.
    pub fn restart_guard(mut self, max_ttl: Duration) -> Self {
        self.config.restart_guard = Some(max_ttl);
        self
    }

    /// What a node must confirm before its agreement to a write counts: the
    /// write in memory (the default), on disk (`WAITAOF`), or on replicas
    /// (`WAIT`). See [`Durability`]. The confirmation's timeout must be
    /// shorter than the [node timeout](RedlockBuilder::node_timeout).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// Whether [`Redlock::stats`] counts (a relaxed atomic add per event, and
    /// one histogram bucket per grant). Defaults to on; off, `stats()`
    /// reports zeros. The `metrics` feature's facade calls are not affected.
    /// The benchmark measures the difference (scenario 9).
    pub fn stats(mut self, enabled: bool) -> Self {
        self.config.stats = enabled;
        self
    }

    /// The certificates for `rediss://` nodes: a custom CA, a client
    /// identity for mutual TLS (feature `tls`). Defaults to the system's
    /// roots and no client certificate.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::engine::tls::TlsConfig) -> Self {
        self.config.tls = Some(tls);
        self
    }

    /// Validates the configuration and makes the manager. Connects to
    /// nothing: each node's connection is made on its first use and then
    /// kept, so nodes that are down now are used once they come up.
    ///
    /// # Errors
    /// [`Error::EmptyNodeList`], [`Error::InvalidNodeAddress`],
    /// [`Error::DuplicateNode`], or [`Error::InvalidSetting`] naming the
    /// setting.
    pub fn build(self) -> Result<Redlock, Error> {
        let config = self.config;
        if self.nodes.is_empty() {
            return Err(Error::EmptyNodeList);
        }
        if config.node_timeout.is_zero() {
            return Err(Error::InvalidSetting {
                setting: "node_timeout",
                reason: "must be longer than zero",
            });
        }
        if config.connect_timeout.is_zero() {
            return Err(Error::InvalidSetting {
                setting: "connect_timeout",
                reason: "must be longer than zero",
            });
        }
        if config.renew_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::InvalidSetting {
                setting: "renew_interval",
                reason: "must be longer than zero",
            });
        }
        if !config.drift_factor.is_finite() || !(0.0..1.0).contains(&config.drift_factor) {
            return Err(Error::InvalidSetting {
                setting: "drift_factor",
                reason: "must be finite and in [0, 1)",
            });
        }
        if config.renew_concurrency == 0 {
            return Err(Error::InvalidSetting {
                setting: "renew_concurrency",
                reason: "must be at least 1",
            });
        }
        if config.max_hold.is_some_and(|m| m.is_zero()) {
            return Err(Error::InvalidSetting {
                setting: "max_hold",
                reason: "must be longer than zero",
            });
        }
        if config
            .restart_guard
            .is_some_and(|g| g.is_zero() || g > crate::protocol::timing::MAX_TTL)
        {
            return Err(Error::InvalidSetting {
                setting: "restart_guard",
                reason: "must be longer than zero and at most MAX_TTL",
            });
        }
        if let Some(g) = config.restart_guard
            && crate::protocol::timing::Ttl::new(g, config.drift_factor).is_err()
        {
            // Every ttl is then at or below its drift allowance, or above
            // `max_ttl`: no lock could ever be taken.
            return Err(Error::InvalidSetting {
                setting: "restart_guard",
                reason: "must be longer than its clock drift allowance (max_ttl × drift_factor + 2 ms): no ttl would fit under it",
            });
        }
        if config
            .durability
            .timeout()
            .is_some_and(|t| t.is_zero() || t >= config.node_timeout)
        {
            return Err(Error::InvalidSetting {
                setting: "durability",
                reason: "the confirmation timeout must be longer than zero and shorter than node_timeout",
            });
        }
        let generation = Generation {
            marker: keys::marker_key(&config.key_prefix),
            candidate: new_token()?,
            guard: config.restart_guard,
        };
        let identities = Arc::new(Identities::default());
        let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(self.nodes.len());
        for (index, info) in self.nodes.into_iter().enumerate() {
            let info = info.map_err(|(entry, reason)| Error::InvalidNodeAddress {
                index,
                entry,
                reason,
            })?;
            let name = target_label(&info);
            // Two databases of one server are one server: compare addresses
            // without the database (and a cluster by each of its seeds).
            let addrs = target_addrs(&info);
            if let Some(first) = nodes
                .iter()
                .position(|n| n.addrs().iter().any(|a| addrs.contains(a)))
            {
                return Err(Error::DuplicateNode {
                    index,
                    first,
                    first_node: nodes[first].label().to_owned(),
                    node: name,
                });
            }
            let node = Node::new(index, info, &config, identities.clone()).map_err(|e| {
                Error::InvalidNodeAddress {
                    index,
                    entry: name.clone(),
                    reason: e.to_string(),
                }
            })?;
            nodes.push(Arc::new(node));
        }
        if nodes.len().is_multiple_of(2) {
            trace::warning!(
                nodes = nodes.len(),
                "an even number of nodes tolerates no more failures than one node fewer"
            );
        }
        let renewals = tokio::sync::Semaphore::new(config.renew_concurrency);
        let attempts = tokio::sync::Semaphore::new(crate::engine::ATTEMPTS_IN_FLIGHT);
        let retries = Retries::new(nodes.len());
        let stats = crate::engine::counters::Counters::new(config.stats);
        let waits = crate::engine::wait::registry::Waits::new(nodes.clone(), LEASE);
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                config,
                renewals,
                attempts,
                retries,
                misconfigured: Default::default(),
                warmed: Default::default(),
                stats,
                generation,
                waits,
                extensions: Default::default(),
                finishers: Default::default(),
            }),
        })
    }
}
