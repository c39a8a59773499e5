//! The face: [`Redlock`] and every public method, in one `impl` block.
//! Each method checks nothing and computes nothing of its own beyond its
//! arguments: it calls the engine ([`crate::engine`]), where the work is
//! done on the manager's inner state.
//!
//! The longest method docs (with their examples) are kept in `docs/*.md`
//! beside this file and included with `#[doc = include_str!(..)]`, so that
//! the one `impl` block stays readable as a list of the operations.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::address::NodeAddress;
use crate::api::builder::RedlockBuilder;
use crate::api::guard::{LockGuard, LockWatch};
use crate::api::resources::Resources;
use crate::api::stats::Stats;
use crate::engine::Inner;
use crate::engine::health::Health;
use crate::engine::inflight::InFlight;
use crate::engine::lock::{Held, Lock};
use crate::protocol::error::Error;
use crate::protocol::keys;
use crate::protocol::quorum::quorum;
use crate::protocol::timing::{self, Patience};

/// A distributed lock manager over N independent Redis masters.
///
/// Cheap to clone (an `Arc` inside); clones share one long-lived,
/// multiplexed connection per node, made on first use and made again when
/// it breaks, when it failed (with a backoff), or when the manager is used
/// on another Tokio runtime than the one that made it.
///
/// See the [crate documentation](crate) for the algorithm and its limits.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use redlock_quorum::{Error, Redlock};
///
/// # async fn run() -> Result<(), Error> {
/// let redlock = Redlock::new([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])?;
/// let lock = redlock.lock("stock:42", Duration::from_secs(5)).await?;
/// // ... decrement the stock, within lock.validity() ...
/// redlock.unlock(&lock).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Redlock {
    pub(crate) inner: Arc<Inner>,
}

impl Redlock {
    /// A builder over the given nodes, with the defaults documented on each
    /// setting. Each node is a URL such as `"redis://127.0.0.1:7001/"` or
    /// `"redis://:password@host:6379/0"`, or a [`redis::ConnectionInfo`]
    /// (see [`NodeAddress`]).
    pub fn builder<I>(nodes: I) -> RedlockBuilder
    where
        I: IntoIterator,
        I::Item: NodeAddress,
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
        I::Item: NodeAddress,
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
        self.inner.nodes.iter().map(|n| n.label())
    }

    /// How many releases are still owed to nodes that could not be reached,
    /// over all nodes (see [`unlock`](Redlock::unlock)).
    pub fn pending_releases(&self) -> usize {
        self.inner.retries.owed()
    }

    /// A snapshot of what this manager (and its clones) did since it was
    /// built: acquisitions by outcome, renewals, losses, per-node failures,
    /// owed releases and acquire-latency percentiles. Always available; the
    /// counting costs a relaxed atomic add per event.
    pub fn stats(&self) -> Stats {
        Stats::of(&self.inner)
    }

    /// Asks every node at once (each bounded by the connect and node
    /// timeouts) for its version, `run_id`, role and persistence, and
    /// reports them with the round trip, whether a quorum is reachable, and
    /// warnings: a node that is a replica (replication is not a quorum), a
    /// node without AOF persistence (it forgets its locks on restart), an
    /// even node count. What a service exposes on its readiness endpoint.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn health(&self) -> Health {
        self.inner.health().await
    }

    #[doc = include_str!("docs/lock.md")]
    pub async fn lock(&self, resources: impl Resources, ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        let names = resources.names();
        self.inner
            .lock_patiently(names.as_slice(), ttl, patience)
            .await
    }

    /// Acquires `resources` (one name or a set) for `ttl` with one attempt:
    /// it does not wait for another holder. It does settle a split vote (see
    /// [`lock`](Redlock::lock)): among contenders that start together,
    /// exactly one gets the lock and the others get [`Error::Conflict`].
    /// Where too few nodes answered to tell (nodes down or slow), it also
    /// tries up to six more rounds, with random pauses of up to 5 ms
    /// doubling each time (315 ms at most in all), before it returns the
    /// error. Each round waits up to the node timeout for the nodes that do
    /// not answer: with nodes paused, a failed `try_lock` takes up to about
    /// 0.7 s with the default 50 ms node timeout (more on a busy machine);
    /// with nodes down (refusing connections), about the pauses: up to
    /// about 300 ms.
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    pub async fn try_lock(&self, resources: impl Resources, ttl: Duration) -> Result<Lock, Error> {
        let names = resources.names();
        self.inner
            .lock_patiently(names.as_slice(), ttl, Patience::Retries(0))
            .await
    }

    #[doc = include_str!("docs/lock_within.md")]
    pub async fn lock_within(
        &self,
        resources: impl Resources,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        let names = resources.names();
        self.inner
            .lock_patiently(names.as_slice(), ttl, patience)
            .await
    }

    #[doc = include_str!("docs/acquire.md")]
    pub async fn acquire(
        &self,
        resources: impl Resources,
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.acquire_patiently(resources.names().as_slice(), ttl, patience)
            .await
    }

    #[doc = include_str!("docs/try_acquire.md")]
    pub async fn try_acquire(
        &self,
        resources: impl Resources,
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        self.acquire_patiently(resources.names().as_slice(), ttl, Patience::Retries(0))
            .await
    }

    /// Acquires `resources` (one name or a set) with a renewing guard,
    /// waiting at most about `wait` for another holder to let go: the guard
    /// of [`acquire`](Redlock::acquire), the patience of
    /// [`lock_within`](Redlock::lock_within).
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn acquire_within(
        &self,
        resources: impl Resources,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.acquire_patiently(resources.names().as_slice(), ttl, patience)
            .await
    }

    #[doc = include_str!("docs/with_lock.md")]
    pub async fn with_lock<F, Fut, T>(
        &self,
        resources: impl Resources,
        ttl: Duration,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(resources, ttl).await?;
        // Boxed so that it can be dropped before the release on loss.
        let mut work = Box::pin(work(guard.watch()));
        let outcome = tokio::select! {
            // On a tie, loss wins: the work's result may not be trusted.
            biased;
            reason = guard.lost() => Err(reason),
            value = &mut work => Ok(value),
        };
        drop(work);
        // The work may have finished after `expires_at` without yielding
        // to the watchdog: the guard never says "held" past `expires_at`.
        let outcome = match outcome {
            Ok(value) => match guard.loss() {
                None => Ok(value),
                Some(reason) => Err(reason),
            },
            Err(reason) => Err(reason),
        };
        let guard_label = guard.watch().lock().label().into_owned();
        let _ = guard.release().await;
        outcome.map_err(|reason| Error::LockLost {
            resource: guard_label,
            reason,
        })
    }

    #[doc = include_str!("docs/extend.md")]
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        self.inner.extend(lock, ttl).await
    }

    /// Releases the lock on every node where it still holds our token,
    /// waiting for every node (each bounded by the timeouts). On each node,
    /// the release goes after the requests that granted the lock there, so
    /// a `SET` that was still in flight when [`lock`](Redlock::lock)
    /// returned cannot land after it: queued behind that `SET` on the same
    /// connection (the node runs them in order; sent once more if the `SET`
    /// itself had to be sent again), or sent once it settled. Returns how
    /// many nodes released it.
    ///
    /// Nodes that could not be reached are retried in the background, one
    /// task per node however many locks are owed to it, until the keys
    /// would have expired anyway or the manager is dropped.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when a quorum answered that the key was not ours
    /// and none released it (the lock expired, or changed hands);
    /// [`Error::NoQuorum`] or [`Error::Redis`] when so many nodes failed or
    /// did not answer that the lock may still be in force on a quorum of
    /// them (it then ends with its ttl).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the keys on nodes that had not been
    /// written to yet; they expire with the lock's ttl.
    pub async fn unlock(&self, lock: &Lock) -> Result<usize, Error> {
        self.inner.unlock(lock).await
    }

    /// Asks the nodes whether the lock is still held: whether a quorum holds
    /// its token right now. Changes nothing. This is the remote view; the
    /// local one is [`Lock::validity`], which a holder must still respect
    /// (a quorum may hold the keys a little past the validity, by design).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn migrate() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let lock = redlock.lock("migration", Duration::from_secs(30)).await?;
    /// migrate().await;
    /// // Before the step that cannot be undone: still ours, locally and on
    /// // a quorum of the nodes?
    /// if lock.is_valid() && redlock.verify(&lock).await? {
    ///     // ... commit ...
    /// }
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoQuorum`] or [`Error::Redis`] when too few nodes answered
    /// to tell either way.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn verify(&self, lock: &Lock) -> Result<bool, Error> {
        self.inner.verify(lock).await
    }

    /// Rebuilds a lock from its resources (one name or the set) and token,
    /// handed over by the
    /// process that acquired it (redsync's `WithValue`): for
    /// [`unlock`](Redlock::unlock), [`extend`](Redlock::extend) and
    /// [`verify`](Redlock::verify) only. Its validity is unknown here
    /// ([`Lock::validity`] is zero until it is extended), and a release to
    /// an unreachable node is retried for a minute at most.
    ///
    /// Whoever passes the token on is responsible for the handover: both
    /// processes can release or extend the lock, and nothing tells either
    /// that the other did. Extend it first to learn its validity.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock, token: String) -> Result<(), Error> {
    /// // The process that took the lock handed over the resource name and
    /// // `lock.token()` (over a channel as private as the token deserves).
    /// let adopted = redlock.adopt("import:7", &token)?;
    /// // Extending it gives it a validity here; `NotHeld` if it was lost.
    /// let lock = redlock.extend(&adopted, Duration::from_secs(30)).await?;
    /// // ... finish the import within lock.validity() ...
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// The name errors of [`lock`](Redlock::lock) ([`Error::EmptyResource`]
    /// and, for a set, the others), or [`Error::InvalidToken`] for an empty
    /// token.
    pub fn adopt(&self, resources: impl Resources, token: &str) -> Result<Lock, Error> {
        let names = resources.names();
        let names = names.as_slice();
        keys::check_resources(names)?;
        if token.is_empty() {
            return Err(Error::InvalidToken {
                reason: "it is empty: an adopted lock needs the token its holder gave it",
            });
        }
        let now = Instant::now();
        Ok(Lock {
            held: Held::list(names, |name| self.inner.key(name)),
            token: token.to_owned(),
            started_at: now,
            expires_at: now,
            key_expiry: timing::after(now, timing::ADOPTED_RETRY_WINDOW),
            in_flight: InFlight::default(),
            adopted: true,
        })
    }

    #[doc = include_str!("docs/fencing_token.md")]
    pub async fn fencing_token(&self, lock: &Lock) -> Result<u64, Error> {
        self.inner.fencing_token(lock).await
    }

    async fn acquire_patiently(
        &self,
        resources: &[&str],
        ttl: Duration,
        patience: Patience,
    ) -> Result<LockGuard, Error> {
        let interval = self.inner.renew_interval(ttl)?;
        let lock = self.inner.lock_patiently(resources, ttl, patience).await?;
        Ok(LockGuard::start(&self.inner, lock, ttl, interval))
    }
}
