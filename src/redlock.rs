//! The `Redlock` manager: acquisition, extension and release on a quorum.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Cmd, IntoConnectionInfo};

use crate::builder::{Config, RedlockBuilder};
use crate::error::Error;
use crate::lock::{Lock, new_token};
use crate::node::Node;
use crate::quorum::{self, Refusal, Tally, Ttl, Until, quorum};
use crate::release::{Cleanup, release};
use crate::scripts;

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

impl Redlock {
    /// A builder over the given nodes, with the defaults documented on each
    /// setting. Each node is anything redis-rs accepts as an address, such as
    /// `"redis://127.0.0.1:7001/"` or `"redis://:password@host:6379/0"`.
    pub fn builder<I>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        RedlockBuilder::new(nodes)
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
            key_expiry: ttl.key_expiry(Instant::now()),
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
                release(inner, &key, &token, ttl.key_expiry(start)).await;
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
