//! The face: [`Redlock`] and every public method, in one `impl` block.
//! Each method checks nothing and computes nothing of its own beyond its
//! arguments: it calls the engine ([`crate::engine`]), where the work is
//! done on the manager's inner state.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::address::NodeAddress;
use crate::api::builder::RedlockBuilder;
use crate::api::guard::{LockGuard, LockWatch};
use crate::api::stats::Stats;
use crate::engine::Inner;
use crate::engine::health::Health;
use crate::engine::inflight::InFlight;
use crate::engine::lock::Lock;
use crate::protocol::error::Error;
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

    /// Acquires `resource` for `ttl`, waiting for another holder to let go.
    ///
    /// Waiting is event-driven: a refused attempt learns the holder's
    /// remaining ttl in the same round, subscribes to the key's release
    /// channel on every node, tries once more, and then sleeps until the
    /// holder's release is published, its keys expire, or the timed retry
    /// (`retry_delay` plus random jitter) is due, whichever comes first. The
    /// timed retry is the fallback where a release cannot be notified (pub/sub
    /// denied, a node down, a broken subscription); see the README's
    /// "Waiting for a held lock". It gives up after `retry_count` timed
    /// retries, or once it slept as long as that many pauses could take.
    /// Within one manager, waiters of a resource are woken one per release,
    /// in the order they started waiting; across managers there is no order.
    ///
    /// Each attempt sends `SET key token NX PX ttl GET` to every node at
    /// once, grants as soon as a quorum agreed, and stops listening as soon
    /// as the outcome is certain; a failed attempt is released on every
    /// node. When contenders that started together shared the nodes so that
    /// none can have a quorum (a split vote), the next attempt settles it.
    /// The last attempt settles it itself: when no other holder is known to
    /// have a quorum (a split vote, or too few answers to tell), it releases
    /// and tries again after a few random milliseconds, up to 6 more rounds
    /// with at most 315 ms of pauses, so that among contenders that start
    /// together exactly one wins.
    ///
    /// # Errors
    /// The last attempt's error: [`Error::Conflict`], [`Error::NoQuorum`] or
    /// [`Error::ValidityExpired`]; at once, errors that retrying cannot fix:
    /// [`Error::Redis`] (a key of the wrong type or a read-only node on too
    /// many nodes), [`Error::DuplicateNode`]; the argument errors
    /// [`Error::EmptyResource`], [`Error::ZeroTtl`],
    /// [`Error::TtlNotAboveDrift`], [`Error::TtlTooLarge`] before anything is
    /// sent.
    ///
    /// # Cancel safety
    /// Dropping the future at any await point leaves no key of ours behind
    /// longer than needed: the attempt under way is released on every node by
    /// a task spawned on the current Tokio runtime. A waiter dropped while it
    /// waits leaves its place at once (a wake-up it had is passed to the next
    /// waiter), and its key's release channel is unsubscribed when no other
    /// waiter of this manager needs it.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.inner.lock_patiently(&[resource], ttl, patience).await
    }

    /// Acquires `resource` for `ttl` with one attempt: it does not wait for
    /// another holder. It does settle a split vote (see
    /// [`lock`](Redlock::lock)): among contenders that start together,
    /// exactly one gets the lock and the others get [`Error::Conflict`].
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> Result<Lock, Error> {
        self.inner
            .lock_patiently(&[resource], ttl, Patience::Retries(0))
            .await
    }

    /// Acquires `resource` for `ttl`, waiting at most about `wait` for
    /// another holder to let go: waits as [`lock`](Redlock::lock) does
    /// (woken by the release, the holder's expiry or the timed retry), and
    /// starts no attempt later than a node timeout before `wait` is up. `Duration::ZERO` makes one attempt, as
    /// [`try_lock`](Redlock::try_lock). The last attempt may end up to one
    /// round (bounded by the timeouts) after `wait`.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // Wait up to two seconds for the current holder, not longer.
    /// let ttl = Duration::from_secs(10);
    /// match redlock.lock_within("report", ttl, Duration::from_secs(2)).await {
    ///     Ok(lock) => {
    ///         // ... the work, within lock.validity() ...
    ///         redlock.unlock(&lock).await?;
    ///     }
    ///     Err(Error::Conflict { .. }) => eprintln!("still busy after 2 s"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock).
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock).
    pub async fn lock_within(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.inner.lock_patiently(&[resource], ttl, patience).await
    }

    /// Acquires every resource of `resources` for `ttl`, all or nothing,
    /// with the retries of [`lock`](Redlock::lock).
    ///
    /// Each attempt runs one script per node that sets every key (the key
    /// prefix followed by each name, as for [`lock`](Redlock::lock)) to one
    /// token, or none when any of them is held by someone else. A node
    /// agrees only when it set the whole set, and the lock is granted when
    /// a quorum agreed: the rule of a single lock, applied to the set. So
    /// two requests whose sets overlap exclude each other, a single lock on
    /// one of the resources excludes a set that contains it, and since no
    /// request ever holds part of its set while waiting for the rest, there
    /// is no deadlock whatever order the names come in. The layout and the
    /// all-or-nothing rule are node-redlock's, so its `acquire([a, b], ttl)`
    /// and this exclude each other too.
    ///
    /// The returned [`Lock`] holds the whole set:
    /// [`extend`](Redlock::extend), [`unlock`](Redlock::unlock),
    /// [`verify`](Redlock::verify) and
    /// [`fencing_token`](Redlock::fencing_token) act on every resource at
    /// once. A slice of one name is the same as [`lock`](Redlock::lock).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // A transfer needs both accounts; nobody can hold one and wait for
    /// // the other.
    /// let lock = redlock
    ///     .lock_many(&["account:17", "account:42"], Duration::from_secs(5))
    ///     .await?;
    /// // ... move the money, within lock.validity() ...
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), where an error names the resources
    /// joined by `", "` (past four, the first four and how many more).
    /// Before anything is sent: [`Error::NoResources`] for an empty list,
    /// [`Error::DuplicateResource`] for a name given twice,
    /// [`Error::EmptyResource`] for an empty name and
    /// [`Error::TooManyResources`] past [`MAX_RESOURCES`](crate::MAX_RESOURCES).
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key
    /// behind longer than needed.
    pub async fn lock_many(&self, resources: &[&str], ttl: Duration) -> Result<Lock, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.inner.lock_patiently(resources, ttl, patience).await
    }

    /// Acquires every resource of `resources` with one attempt: the set of
    /// [`lock_many`](Redlock::lock_many), the patience of
    /// [`try_lock`](Redlock::try_lock).
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many), without the retries.
    ///
    /// # Cancel safety
    /// As [`lock_many`](Redlock::lock_many).
    pub async fn try_lock_many(&self, resources: &[&str], ttl: Duration) -> Result<Lock, Error> {
        self.inner
            .lock_patiently(resources, ttl, Patience::Retries(0))
            .await
    }

    /// Acquires every resource of `resources`, waiting at most about `wait`
    /// for other holders: the set of [`lock_many`](Redlock::lock_many), the
    /// patience of [`lock_within`](Redlock::lock_within).
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many).
    ///
    /// # Cancel safety
    /// As [`lock_many`](Redlock::lock_many).
    pub async fn lock_many_within(
        &self,
        resources: &[&str],
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.inner.lock_patiently(resources, ttl, patience).await
    }

    /// Acquires `resource` (with the retries of [`lock`](Redlock::lock)) and
    /// returns a guard that renews it in the background on a quorum, every
    /// renewal interval (ttl / 3 unless the builder's `renew_interval` says
    /// otherwise), until the guard is released, forgotten or dropped, the
    /// lock is lost, or the builder's `max_hold` is reached.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn rebuild_index() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let guard = redlock.acquire("reindex", Duration::from_secs(10)).await?;
    /// tokio::select! {
    ///     () = rebuild_index() => {}
    ///     reason = guard.lost() => eprintln!("lock lost: {reason}"),
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Redlock::lock), and [`Error::InvalidSetting`] when the
    /// configured renewal interval is not shorter than `ttl` minus the drift
    /// allowance, or [`Error::TtlTooShortToRenew`] when `ttl` is too short
    /// for the default interval.
    ///
    /// # Cancel safety
    /// As [`lock`](Redlock::lock): dropping the future leaves no key behind.
    /// Once it returned, the guard owns the lock.
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.acquire_patiently(resource, ttl, patience).await
    }

    /// Acquires `resource` with one attempt and a renewing guard: the
    /// guard of [`acquire`](Redlock::acquire), the patience of
    /// [`try_lock`](Redlock::try_lock). The shape of a scheduled job that
    /// every instance starts and only one may run.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn send_invoices() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// // Every instance's cron fires at 02:00; one runs the job.
    /// match redlock.try_acquire("job:invoices:2026-12-02", Duration::from_secs(60)).await {
    ///     Ok(guard) => {
    ///         send_invoices().await;
    ///         // Keep the key until it expires, so that an instance whose
    ///         // clock fired late does not run the job a second time.
    ///         guard.forget();
    ///     }
    ///     Err(Error::Conflict { .. }) => {} // another instance runs it
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire), without the retries.
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn try_acquire(&self, resource: &str, ttl: Duration) -> Result<LockGuard, Error> {
        self.acquire_patiently(resource, ttl, Patience::Retries(0))
            .await
    }

    /// Acquires `resource` with a renewing guard, waiting at most about
    /// `wait` for another holder to let go: the guard of
    /// [`acquire`](Redlock::acquire), the patience of
    /// [`lock_within`](Redlock::lock_within).
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn acquire_within(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Until(timing::after(Instant::now(), wait));
        self.acquire_patiently(resource, ttl, patience).await
    }

    /// Acquires every resource of `resources` (as
    /// [`lock_many`](Redlock::lock_many)) with a guard that renews them all
    /// in the background, as [`acquire`](Redlock::acquire) does for one.
    /// The guard's lock is lost as a whole: one renewal extends every key,
    /// and fails where any of them is not ours.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn move_stock() {}
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let guard = redlock
    ///     .acquire_many(&["warehouse:north", "warehouse:south"], Duration::from_secs(10))
    ///     .await?;
    /// tokio::select! {
    ///     () = move_stock() => {}
    ///     reason = guard.lost() => eprintln!("lost: {reason}"),
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock_many`](Redlock::lock_many) and as
    /// [`acquire`](Redlock::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn acquire_many(
        &self,
        resources: &[&str],
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        let patience = Patience::Retries(self.inner.config.retry_count);
        self.acquire_many_patiently(resources, ttl, patience).await
    }

    /// [`acquire_many`](Redlock::acquire_many) with one attempt.
    ///
    /// # Errors
    /// As [`acquire_many`](Redlock::acquire_many), without the retries.
    ///
    /// # Cancel safety
    /// As [`acquire`](Redlock::acquire).
    pub async fn try_acquire_many(
        &self,
        resources: &[&str],
        ttl: Duration,
    ) -> Result<LockGuard, Error> {
        self.acquire_many_patiently(resources, ttl, Patience::Retries(0))
            .await
    }

    /// Runs `work` under the lock: acquires `resource` with a renewing guard
    /// (as [`acquire`](Redlock::acquire)), runs the future that `work` makes
    /// from the guard's [`LockWatch`], and releases the lock when it ends.
    ///
    /// If the lock is lost while the future runs, the future is dropped
    /// (cancelled at its current await point) and [`Error::LockLost`] is
    /// returned. If the future finished but the lock was not held for the
    /// whole of it (work that blocked the thread past the validity, so that
    /// the loss could not cancel it), the value is dropped and
    /// [`Error::LockLost`] is returned too. The lock is released on every
    /// exit path: success, loss, a panic in the future (released from the
    /// watchdog task as the guard unwinds, then the panic goes on), and the
    /// cancellation of `with_lock` itself. A failed release after the work
    /// succeeded is not reported: the work's value is returned and the keys
    /// expire with their ttl.
    ///
    /// Work that writes to a resource outside Redis should still check
    /// [`LockWatch::is_held`] before each write, or better, pass a fencing
    /// token: cancellation only happens at await points.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let rows = redlock
    ///     .with_lock("ledger", Duration::from_secs(5), |watch| async move {
    ///         // ... check watch.is_held() before each write ...
    ///         assert!(watch.is_held());
    ///         42
    ///     })
    ///     .await?;
    /// assert_eq!(rows, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](Redlock::acquire), and [`Error::LockLost`] when the
    /// lock was lost before the work finished.
    ///
    /// # Cancel safety
    /// Dropping the future drops the work and releases the lock from the
    /// watchdog task.
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LockWatch) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.acquire(resource, ttl).await?;
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
        let _ = guard.release().await;
        outcome.map_err(|reason| Error::LockLost {
            resource: resource.to_owned(),
            reason,
        })
    }

    /// Extends a held lock to `ttl` from now on a quorum, checking ownership
    /// on every node. Returns the lock with a fresh validity measured from
    /// the start of the extension.
    ///
    /// Where our key is missing (a node that restarted empty, or was down
    /// when the lock was taken), the extension sets it again with our token:
    /// the lock regains its redundancy. Such a node does not count towards
    /// this round's quorum, which only nodes that still held our token make.
    ///
    /// A failed extension deletes no key that was ours before it: where the
    /// key is still ours it keeps its previous or extended expiry. When a
    /// quorum answered that the key is not ours, the keys this extension set
    /// again are released.
    ///
    /// The lock's validity is checked again when the round ends: an
    /// extension that ends after the lock passed in expired fails with
    /// [`Error::NotHeld`], whatever the nodes answered, because another
    /// client may have held the resource in between. The lock is over then,
    /// and the extension releases the keys of its token on every node, so
    /// that the keys it renewed do not keep others out for a fresh ttl. (An
    /// [adopted](Redlock::adopt) lock has no validity of its own and is not
    /// checked.)
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has already run out,
    /// before the extension or while it ran, or a quorum answered that the
    /// key is not ours; [`Error::NoQuorum`] when
    /// too few nodes answered for either (a paused or partitioned node: the
    /// lock may still be ours, try again); [`Error::Redis`];
    /// [`Error::ValidityExpired`] when the quorum came too late; the ttl
    /// errors as for `lock`.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves each node extended, healed,
    /// released (after the lock expired) or as it was, and the lock passed
    /// in stays valid until its own `expires_at`.
    pub async fn extend(&self, lock: &Lock, ttl: Duration) -> Result<Lock, Error> {
        self.inner.extend(lock, ttl).await
    }

    /// Releases the lock on every node where it still holds our token,
    /// waiting for every node (each bounded by the timeouts). On each node,
    /// the release is sent after the requests that granted the lock there
    /// settled, so a `SET` that was still in flight when
    /// [`lock`](Redlock::lock) returned cannot land after it. Returns how
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

    /// Rebuilds a lock from its resource and token, handed over by the
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
    /// [`Error::EmptyResource`], or [`Error::InvalidSetting`] for an empty
    /// token.
    pub fn adopt(&self, resource: &str, token: &str) -> Result<Lock, Error> {
        if resource.is_empty() {
            return Err(Error::EmptyResource);
        }
        if token.is_empty() {
            return Err(Error::InvalidSetting {
                setting: "token",
                reason: "an adopted lock needs the token its holder gave it",
            });
        }
        let now = Instant::now();
        Ok(Lock {
            resource: resource.to_owned(),
            key: self.inner.key(resource),
            rest: Vec::new(),
            token: token.to_owned(),
            started_at: now,
            expires_at: now,
            key_expiry: timing::after(now, timing::ADOPTED_RETRY_WINDOW),
            in_flight: InFlight::default(),
            adopted: true,
        })
    }

    /// A fencing token for a held lock: a number larger than any token given
    /// to an earlier holder of the same resource (through this crate, on the
    /// same nodes). Pass it with every write to the protected resource and
    /// have the resource reject a write whose token is lower than one it has
    /// already seen: that stops a holder that was paused past its validity,
    /// which no lock with an expiry can stop by itself.
    ///
    /// The counter is one key per node, shared by every resource, without
    /// expiry: the key prefix, the byte `0xFF` and `counter` (no resource's
    /// lock key can ever be that key, since resource names are UTF-8). No
    /// key is left per resource. Tokens are therefore larger than every
    /// earlier token of *every* resource on the same nodes and key prefix,
    /// and two holders of different resources may get the same number: only
    /// a resource's own tokens are to be compared. Ask for the token once
    /// per acquisition, right after it; two calls for the same lock may
    /// return the same number.
    ///
    /// For a lock on several resources (see
    /// [`lock_many`](Redlock::lock_many)) the token comes from the same
    /// counter: larger than any token given before on any of them, and
    /// smaller than any given later on any of them.
    ///
    /// Versions before this one kept a counter per resource (the lock key,
    /// `0xFF`, `fence`). Where such a key is still there, the read takes it
    /// as a floor, so the first token after an upgrade is larger than the
    /// resource's last one (as long as a node that holds it keeps its data),
    /// and the write deletes it once the node's counter holds as much.
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use redlock_quorum::{Error, Redlock};
    ///
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// let lock = redlock.lock("invoice:7", Duration::from_secs(10)).await?;
    /// let token = redlock.fencing_token(&lock).await?;
    /// // UPDATE invoices SET ..., fence = $token WHERE id = 7 AND fence < $token
    /// # let _ = token;
    /// redlock.unlock(&lock).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Never a repeat
    /// Each node's counter is tagged with the node's data generation (see
    /// [`RedlockBuilder::restart_guard`](crate::RedlockBuilder::restart_guard)
    /// for the marker). A counter that is missing, bare, or was written
    /// before the node lost its data, is *untrusted*. With `n` nodes, a
    /// quorum `q` and `f = n − q`, the number read is used only when at
    /// least `q` nodes answered with the lock ours, at least `q` counters
    /// were read, and `min(untrusted, f) + silent < q` (`silent` = the nodes
    /// whose counter was not read: no answer, or too young under the
    /// restart guard; a node where the lock is not ours still has its
    /// counter read). Then some node of the last token's write quorum that
    /// kept its data (or was trusted again since, see below) was read, and
    /// the new token is larger than every earlier one, as long as fewer
    /// than half the nodes lost their data since the last token. Otherwise
    /// the call fails closed with [`Error::FencingUnproven`].
    ///
    /// In practice, with a quorum of nodes answering and trusted, a token is
    /// made, for a resource never used before too. Every node must answer
    /// for the very first tokens on a brand-new set of nodes (until the
    /// nodes' markers are a few seconds old and a token trusts them) and
    /// while too many nodes are untrusted after losing their data (a read
    /// left unproven by nodes that did not answer is made up to three
    /// times). A node that lost its data is trusted again by the first
    /// token made at least `2 × (2 s + the read's duration)` after its new
    /// marker was made: a token is issued only when its write reached a
    /// quorum within 2 s, so every token the node took before it lost its
    /// data was issued before that read began, and that read saw it.
    /// Assumed: node clocks run at most twice as fast as ours and do not
    /// jump forward.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock's validity has run out or a quorum
    /// says it is not ours; [`Error::FencingUnproven`] when the number
    /// cannot be proven larger than every earlier token (above);
    /// [`Error::NoQuorum`] or [`Error::Redis`] when too few nodes answered,
    /// or the write took more than 2 s to reach a quorum.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves the counters as they were or
    /// raised (and some older per-resource counters deleted where the
    /// node's counter holds as much); ask again.
    pub async fn fencing_token(&self, lock: &Lock) -> Result<u64, Error> {
        self.inner.fencing_token(lock).await
    }

    async fn acquire_patiently(
        &self,
        resource: &str,
        ttl: Duration,
        patience: Patience,
    ) -> Result<LockGuard, Error> {
        let interval = self.inner.renew_interval(ttl)?;
        let lock = self
            .inner
            .lock_patiently(&[resource], ttl, patience)
            .await?;
        Ok(LockGuard::start(&self.inner, lock, ttl, interval))
    }

    async fn acquire_many_patiently(
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
