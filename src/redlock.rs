//! The `Redlock` manager and its builder.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, IntoConnectionInfo, RedisError};

use crate::error::Error;
use crate::lock::{Lock, new_token};
use crate::node::{Node, label};
use crate::quorum::{self, Refusal, Tally, Ttl, Until, quorum};
use crate::scripts;

/// Default number of retries after the first attempt.
pub const DEFAULT_RETRY_COUNT: u32 = 10;
/// Default pause between attempts.
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
/// Default upper bound of the random jitter added to the pause.
pub const DEFAULT_RETRY_JITTER: Duration = Duration::from_millis(100);
/// Default bound on each request to one node.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// Default bound on renewals in flight at once per manager.
pub const DEFAULT_RENEW_CONCURRENCY: usize = 256;
/// Default clock drift factor.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

/// A distributed lock manager over N independent Redis masters.
///
/// Cheap to clone (an `Arc` inside); clones share one long-lived,
/// multiplexed, reconnecting connection per node, made on first use. The
/// connections (and the watchdogs of [`LockGuard`](crate::LockGuard)s) run
/// on the Tokio runtime that first used them: use one manager per runtime.
///
/// See the [crate documentation](crate) for the algorithm and its limits.
#[derive(Clone, Debug)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Node>,
    pub(crate) config: Config,
    /// Admission for the watchdogs' renewals; see `renew_concurrency`.
    pub(crate) renewals: tokio::sync::Semaphore,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) retry_count: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_jitter: Duration,
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) key_prefix: String,
    pub(crate) renew_interval: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) renew_concurrency: usize,
}

/// Configures a [`Redlock`]. Made by [`Redlock::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct RedlockBuilder {
    nodes: Vec<Result<redis::ConnectionInfo, RedisError>>,
    config: Config,
}

impl RedlockBuilder {
    /// Retries after the first attempt in [`Redlock::lock`]. Defaults to 10.
    pub fn retry_count(mut self, retries: u32) -> Self {
        self.config.retry_count = retries;
        self
    }

    /// The pause between attempts. Defaults to 200 ms.
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

    /// The bound on each request to one node (connecting included). A node
    /// that does not answer within it counts as failed for that round. Keep
    /// it well under the ttls you use. Defaults to 50 ms; must not be zero.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
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
    /// allowance of each lock acquired with [`Redlock::acquire`]; a failed
    /// renewal is retried after `retry_delay` (or the interval, if shorter).
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
        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes.len());
        for (index, info) in self.nodes.into_iter().enumerate() {
            let info = info.map_err(|source| Error::InvalidNodeAddress { index, source })?;
            let name = label(&info);
            if let Some(first) = nodes.iter().position(|n| n.label() == name) {
                return Err(Error::DuplicateNode {
                    index,
                    first,
                    node: name,
                });
            }
            let node = Node::new(info, config.node_timeout)
                .map_err(|source| Error::InvalidNodeAddress { index, source })?;
            nodes.push(node);
        }
        let renewals = tokio::sync::Semaphore::new(config.renew_concurrency);
        Ok(Redlock {
            inner: Arc::new(Inner {
                nodes,
                config,
                renewals,
            }),
        })
    }
}

impl Redlock {
    /// A builder over the given nodes, with the defaults documented on each
    /// setting. Each node is anything redis-rs accepts as an address, such as
    /// `"redis://127.0.0.1:7001/"` or `"redis://:password@host:6379/0"`.
    pub fn builder<I>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        RedlockBuilder {
            nodes: nodes
                .into_iter()
                .map(IntoConnectionInfo::into_connection_info)
                .collect(),
            config: Config {
                retry_count: DEFAULT_RETRY_COUNT,
                retry_delay: DEFAULT_RETRY_DELAY,
                retry_jitter: DEFAULT_RETRY_JITTER,
                node_timeout: DEFAULT_NODE_TIMEOUT,
                drift_factor: DEFAULT_DRIFT_FACTOR,
                key_prefix: String::new(),
                renew_interval: None,
                max_hold: None,
                renew_concurrency: DEFAULT_RENEW_CONCURRENCY,
            },
        }
    }

    /// A manager over the given nodes with the default settings; the same
    /// as `Redlock::builder(nodes).build()`.
    ///
    /// # Errors
    /// As [`RedlockBuilder::build`].
    pub fn new<I>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        Self::builder(nodes).build()
    }

    /// How many nodes the manager locks on.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// How many nodes must agree: `node_count() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.inner.nodes.len())
    }

    /// The nodes' addresses, without credentials, in the order given.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.inner.nodes.iter().map(Node::label)
    }

    /// Acquires `resource` for `ttl`, retrying up to the configured
    /// `retry_count` times after the first attempt, with `retry_delay` plus
    /// random jitter between attempts.
    ///
    /// Each attempt sends `SET key token NX PX ttl` to every node at once,
    /// grants as soon as a quorum agreed, gives up as soon as a quorum is
    /// impossible, and releases on every node when it fails.
    ///
    /// # Errors
    /// The last attempt's error: [`Error::Conflict`], [`Error::NoQuorum`] or
    /// [`Error::ValidityExpired`]; [`Error::Redis`] at once (retrying cannot
    /// help a key of the wrong type or a read-only node); the argument errors
    /// [`Error::EmptyResource`], [`Error::ZeroTtl`],
    /// [`Error::TtlNotAboveDrift`], [`Error::TtlTooLarge`] before anything is
    /// sent.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves no key of ours behind
    /// longer than needed: the attempt under way is released on every node by
    /// a task spawned on the current Tokio runtime.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let ttl = self.check(resource, ttl)?;
        let mut attempt = 0;
        loop {
            match self.attempt(resource, ttl).await {
                Ok(lock) => return Ok(lock),
                Err(e) if attempt < self.inner.config.retry_count && is_retryable(&e) => {
                    attempt += 1;
                    let c = &self.inner.config;
                    tokio::time::sleep(quorum::retry_delay(c.retry_delay, c.retry_jitter)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Acquires `resource` for `ttl` with exactly one attempt.
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let ttl = self.check(resource, ttl)?;
        self.attempt(resource, ttl).await
    }

    /// Extends a held lock to `ttl` from now on a quorum, checking ownership
    /// on every node (the key's expiry is reset only where it still holds our
    /// token; a missing key is never created). Returns the lock with a fresh
    /// validity measured from the start of the extension.
    ///
    /// A failed extension deletes nothing: where the key is still ours it
    /// keeps its previous or extended expiry.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has already run out or a
    /// quorum said the key is not ours; [`Error::NoQuorum`] or
    /// [`Error::Redis`] when too few nodes answered; [`Error::ValidityExpired`]
    /// when the quorum came too late; the ttl errors as for `lock`.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves each node either extended or
    /// as it was, and the lock passed in stays valid until its own
    /// `expires_at`.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        let ttl = Ttl::new(ttl, self.inner.config.drift_factor)?;
        if !lock.is_valid() {
            return Err(Error::NotHeld {
                resource: lock.resource.clone(),
            });
        }
        let start = Instant::now();
        let tally = quorum::round(
            &self.inner.nodes,
            self.inner.config.node_timeout,
            Until::QuorumOrImpossible,
            |mut conn| {
                let mut call = scripts::EXTEND.key(&lock.key);
                call.arg(&lock.token).arg(ttl.millis);
                async move { call.invoke_async(&mut conn).await }
            },
            quorum::accept_script,
        )
        .await;
        self.grant(&lock.resource, &lock.key, &lock.token, ttl, start, tally)
            .map_err(|e| e.into_error(&lock.resource, self.node_count(), Refusal::NotHeld))
    }

    /// Releases the lock on every node where it still holds our token,
    /// waiting for every node (each bounded by the node timeout). Returns how
    /// many nodes released it. Nodes that could not be reached are retried
    /// in the background until the keys would have expired anyway.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when no node held our token (the lock expired, or
    /// changed hands); [`Error::NoQuorum`] or [`Error::Redis`] when so many
    /// nodes failed or did not answer that the lock may still be in force on
    /// a quorum of them (it then ends with its ttl).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the keys on nodes that had not been
    /// written to yet; they expire with the lock's ttl.
    pub async fn unlock(&self, lock: &Lock) -> Result<usize, Error> {
        let tally = release(&self.inner, &lock.key, &lock.token, lock.key_expiry()).await;
        // Nodes that failed or did not answer may still hold our key. If
        // they are a quorum, the lock may still be in force: say so.
        let maybe_held = tally.unreachable + tally.errors;
        if tally.granted > 0 && maybe_held < self.quorum() {
            return Ok(tally.granted);
        }
        Err(tally.into_error(&lock.resource, self.node_count(), Refusal::NotHeld))
    }

    /// Validates the arguments of an acquisition.
    fn check(&self, resource: &str, ttl: Duration) -> Result<Ttl, Error> {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        Ttl::new(ttl, self.inner.config.drift_factor)
    }

    /// One acquisition attempt; see [`lock`](Redlock::lock).
    async fn attempt(&self, resource: &str, ttl: Ttl) -> Result<Lock, Error> {
        let inner = &self.inner;
        let key = format!("{}{resource}", inner.config.key_prefix);
        let token = new_token()?;
        // Cancellation safety: until the attempt has either been granted or
        // released, this guard releases it from a spawned task if the future
        // is dropped.
        let mut cleanup = Cleanup {
            inner: Some((inner.clone(), key.clone(), token.clone())),
            key_expiry: ttl.deadline(Instant::now()) + ttl.drift,
        };
        let mut set = Cmd::new();
        set.arg("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.millis);
        let set = Arc::new(set);
        let start = Instant::now();
        let tally = quorum::round(
            &inner.nodes,
            inner.config.node_timeout,
            Until::QuorumOrImpossible,
            |mut conn| {
                let set = set.clone();
                async move { set.query_async(&mut conn).await }
            },
            quorum::accept_set,
        )
        .await;
        match self.grant(resource, &key, &token, ttl, start, tally) {
            Ok(lock) => {
                cleanup.disarm();
                Ok(lock)
            }
            Err(failed) => {
                // Release everywhere, the nodes that refused, failed or have
                // not answered yet included: a late SET may still land.
                release(inner, &key, &token, ttl.deadline(start) + ttl.drift).await;
                cleanup.disarm();
                Err(failed.into_error(resource, self.node_count(), Refusal::Conflict))
            }
        }
    }

    /// Turns a round into a lock when a quorum agreed with validity left.
    fn grant(
        &self,
        resource: &str,
        key: &str,
        token: &str,
        ttl: Ttl,
        start: Instant,
        tally: Tally,
    ) -> Result<Lock, Failed> {
        let Some(quorum_at) = tally.quorum_at else {
            return Err(Failed::Round(tally));
        };
        // The validity is measured now, not at the quorum: the caller can use
        // only what is left when it gets the lock.
        let now = Instant::now().max(quorum_at);
        let elapsed = now - start;
        if quorum::validity(ttl.duration, elapsed, ttl.drift).is_none() {
            return Err(Failed::Late {
                elapsed,
                ttl: ttl.duration,
                drift: ttl.drift,
            });
        }
        Ok(Lock {
            resource: resource.to_owned(),
            key: key.to_owned(),
            token: token.to_owned(),
            started_at: start,
            expires_at: ttl.deadline(start),
            ttl: ttl.duration,
        })
    }
}

/// Why a round did not produce a lock.
enum Failed {
    Round(Tally),
    Late {
        elapsed: Duration,
        ttl: Duration,
        drift: Duration,
    },
}

impl Failed {
    fn into_error(self, resource: &str, nodes: usize, refusal: Refusal) -> Error {
        match self {
            Failed::Round(tally) => tally.into_error(resource, nodes, refusal),
            Failed::Late {
                elapsed,
                ttl,
                drift,
            } => Error::ValidityExpired {
                resource: resource.to_owned(),
                elapsed,
                ttl,
                drift,
            },
        }
    }
}

fn is_retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Conflict { .. } | Error::NoQuorum { .. } | Error::ValidityExpired { .. }
    )
}

/// Sends the ownership-checked release to every node and waits for all of
/// them, each bounded by the node timeout.
///
/// Nodes that could not be reached may still hold the key (a SET whose reply
/// was lost with its connection, say), which would keep others out until it
/// expires; a background task keeps trying those nodes until `key_expiry`.
pub(crate) async fn release(
    inner: &Arc<Inner>,
    key: &str,
    token: &str,
    key_expiry: Instant,
) -> Tally {
    let tally = quorum::round(
        &inner.nodes,
        inner.config.node_timeout,
        Until::AllNodes,
        |mut conn| {
            let mut call = scripts::UNLOCK.key(key);
            call.arg(token);
            async move { call.invoke_async(&mut conn).await }
        },
        quorum::accept_script,
    )
    .await;
    if !tally.unanswered.is_empty() && Instant::now() < key_expiry {
        tokio::spawn(retry_release(
            inner.clone(),
            key.to_owned(),
            token.to_owned(),
            tally.unanswered.clone(),
            key_expiry,
        ));
    }
    tally
}

/// Retries the release on the given nodes, with a doubling pause (from the
/// node timeout up to one second), until each answered or the key expired.
async fn retry_release(
    inner: Arc<Inner>,
    key: String,
    token: String,
    mut pending: Vec<usize>,
    key_expiry: Instant,
) {
    let node_timeout = inner.config.node_timeout;
    let mut pause = node_timeout;
    while !pending.is_empty() {
        tokio::time::sleep(pause).await;
        if Instant::now() >= key_expiry {
            return;
        }
        pause = (pause * 2).min(Duration::from_secs(1));
        let attempts = pending.iter().map(|&i| {
            let (key, token) = (&key, &token);
            let node = &inner.nodes[i];
            async move {
                let Ok(mut conn) = node.connection() else {
                    return Some(i);
                };
                let mut call = scripts::UNLOCK.key(key);
                call.arg(token);
                match tokio::time::timeout(node_timeout, call.invoke_async::<i64>(&mut conn)).await
                {
                    Ok(Ok(_)) => None,
                    _ => Some(i),
                }
            }
        });
        pending = futures::future::join_all(attempts)
            .await
            .into_iter()
            .flatten()
            .collect();
    }
}

/// Releases an attempt from a spawned task when the attempt's future is
/// dropped before it was granted or released.
struct Cleanup {
    inner: Option<(Arc<Inner>, String, String)>,
    key_expiry: Instant,
}

impl Cleanup {
    fn disarm(&mut self) {
        self.inner = None;
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some((inner, key, token)) = self.inner.take() else {
            return;
        };
        // Drop must not block: hand the release to the runtime. Without a
        // runtime (the future was polled on one that is gone) the keys expire
        // with their ttl.
        let key_expiry = self.key_expiry;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                release(&inner, &key, &token, key_expiry).await;
            });
        }
    }
}
